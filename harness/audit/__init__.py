"""Capture audit of a model family: build each architecture tiny, capture a decode step, replay it
against eager, compare, classify (DESIGN.md, "Runtimes we did not write")."""
