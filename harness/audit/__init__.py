"""Capture audit of a model family: build each architecture tiny, capture a decode step, replay it
against eager, compare, classify (docs/design.md, "Runtimes we did not write")."""
