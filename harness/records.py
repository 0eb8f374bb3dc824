"""Plain data every part shares: requests in, generations out.

No torch here: a `Generation` produced by any runtime, ours or not, can be compared, saved as JSON and
loaded again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable


EAGER = "eager"  # the producer of a step that no graph ran
# The graph backends by name (`harness.graphs.get_backend`, `--graph-backend`, test-db `backend`
# terms): "auto" stands for cuda where it is available, else the emulator.
BACKENDS = ("auto", "cuda", "emulated")


@dataclass(frozen=True)
class Request:
    """One prompt to complete greedily; `logprobs` is how many top (token, logprob) pairs to keep."""

    prompt: list[int]
    max_new_tokens: int
    logprobs: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": list(self.prompt), "max_new_tokens": self.max_new_tokens, "logprobs": self.logprobs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        return cls(prompt=list(data["prompt"]), max_new_tokens=int(data["max_new_tokens"]),
                   logprobs=int(data.get("logprobs", 2)))


@dataclass(frozen=True)
class Step:
    """One generated token and what the comparison needs to judge it.

    `top` holds the best `(token, logprob)` pairs, best first; `logit_scale` is max |logit| at this
    step (it sets the BF16 spacing the tolerance is counted in); `producer` is "eager" or the text of
    the graph key that ran the step.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    logit_scale: float
    producer: str = EAGER

    def __post_init__(self) -> None:
        # Normalise lists (from JSON) to tuples so that equal steps compare and hash equal.
        object.__setattr__(self, "top", tuple((int(t), float(lp)) for t, lp in self.top))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["top"] = [list(pair) for pair in self.top]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        return cls(token=int(data["token"]), logprob=float(data["logprob"]), top=data["top"],
                   logit_scale=float(data["logit_scale"]), producer=str(data.get("producer", EAGER)))


@dataclass(frozen=True)
class Generation:
    """The greedy continuation of one request: `tokens[i]` is `steps[i].token`."""

    tokens: list[int]
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.steps and [s.token for s in self.steps] != list(self.tokens):
            raise ValueError(
                f"Generation.tokens {list(self.tokens)} disagree with the tokens of its steps "
                f"{[s.token for s in self.steps]}"
            )

    @classmethod
    def from_steps(cls, steps: list[Step]) -> Generation:
        return cls(tokens=[s.token for s in steps], steps=list(steps))

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": list(self.tokens), "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Generation:
        return cls(tokens=[int(t) for t in data["tokens"]], steps=[Step.from_dict(s) for s in data.get("steps", [])])


@dataclass(frozen=True)
class RequestProblem:
    """Why request `index` was not run: the value and the limit it broke."""

    index: int
    reason: str

    def __str__(self) -> str:
        return f"request {self.index}: {self.reason}"


class BadRequestError(ValueError):
    """Some requests broke a limit. `.problems` names each (index, reason with the limit);
    `.generations` holds the results of the others (None at the bad positions)."""

    def __init__(self, problems: Sequence[RequestProblem], generations: list[Generation | None]) -> None:
        self.problems = tuple(problems)
        self.generations = generations
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} of {len(generations)} requests rejected "
                         f"(the others completed; see .generations):\n{lines}")


@runtime_checkable
class Runtime(Protocol):
    """What the checks can compare. The contract every runtime follows (the reference `Engine` and
    `harness.adapters.transformers.TransformersRuntime` alike; `suites/check/test_runtime_contract.py`
    holds any runtime to it):

    - `generate(requests)` returns one `Generation` per request, in order, each of exactly
      `max_new_tokens` greedy steps (no end-of-sequence token stops a request early).
    - Each `Step` carries the generated `token` (the argmax, ties to the lowest id) and its
      `logprob` (log_softmax in fp32); `top`, the best `request.logprobs` pairs by logit, best
      first, the generated token first; `logit_scale`, max |logit| at that step (the comparison
      counts its tolerance in bf16 steps at this scale); and `producer`, "eager" or the text of the
      graph key that ran the step (`decode[bs=4,greedy]`), which the divergence report names.
    - `logprobs` may be 0: the steps then carry no pairs (`top == ()`). It may not be negative or
      exceed the vocabulary.
    - A request the runtime cannot run (an empty prompt, a token outside the vocabulary,
      `max_new_tokens < 1`, too long for the runtime, `logprobs` out of range) does not cost the
      others their results: every valid request runs first, then `BadRequestError` (a ValueError)
      is raised, naming each bad request's index, value and limit, with `.generations` holding the
      valid requests' results (None at the bad positions).
    """

    def generate(self, requests: Sequence[Request]) -> list[Generation]: ...
