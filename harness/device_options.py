"""The emulated CUDA device as a user sets it from text: pytest options, ini keys, a test-db list's
`emulate_cuda` field and `harness run` options all come down to one `EmulatedDevice`.

No torch here: the pytest plugin and the test-db loader read these settings in sessions and
commands that must not import torch before they know they need it. The choices below are those of
`harness.emulation` (suites/cuda_device checks that they agree).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("issue_order", "adversarial")
RACE_MODES = ("strict", "report", "off")
DEFAULT_SCHEDULE = "issue_order"
DEFAULT_RACES = "strict"

_UNITS = {"": 1, "b": 1,
          "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


class DeviceOptionError(ValueError):
    """A device setting that cannot be used; the message names the setting, the value and why."""


def parse_size(text: Any, *, where: str) -> int:
    """Bytes from `8GiB`, `512MiB`, `16GB`, `1.5G` or a plain integer; `where` names the setting."""
    if isinstance(text, bool):
        raise DeviceOptionError(f"{where} {text!r}: not a size; expected e.g. 8GiB, 512MiB, 16GB or bytes")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.fullmatch(str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise DeviceOptionError(f"{where} {text!r}: not a size; expected a number and one of "
                                    f"B, KiB, MiB, GiB, TiB (1024s) or KB, MB, GB, TB (1000s), "
                                    f"e.g. 8GiB")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise DeviceOptionError(f"{where} {text!r}: a device needs at least 1 byte of memory")
    return value


def format_size(value: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def parse_count(text: Any, *, where: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise DeviceOptionError(f"{where} {text!r}: not an integer; expected 1 or more devices") from None
    if value < 1 or isinstance(text, bool):
        raise DeviceOptionError(f"{where} {text!r}: expected 1 or more devices")
    return value


def parse_cuda_version(text: Any, *, where: str) -> str:
    value = str(text).strip()
    if isinstance(text, bool) or not re.fullmatch(r"\d+\.\d+", value):
        raise DeviceOptionError(f"{where} {text!r}: not a CUDA version; expected e.g. 12.8")
    return value


def parse_choice(text: Any, choices: tuple[str, ...], *, where: str) -> str:
    if text not in choices:
        raise DeviceOptionError(f"{where} {text!r}: accepted: {', '.join(choices)}")
    return text


@dataclass(frozen=True)
class EmulatedDevice:
    """The emulated device a session or a list runs under; None keeps emulate_cuda()'s default."""

    total_memory: int | None = None
    name: str | None = None
    device_count: int | None = None
    cuda_version: str | None = None
    schedule: str = DEFAULT_SCHEDULE
    races: str = DEFAULT_RACES

    def emulate_cuda_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `harness.emulate_cuda()` for this device."""
        kwargs: dict[str, Any] = {"schedule": self.schedule, "races": self.races}
        kwargs.update({key: value for key, value in self.properties().items()})
        return kwargs

    def properties(self) -> dict[str, Any]:
        """The device properties set (those that only an emulated device has)."""
        return {key: getattr(self, key) for key in ("total_memory", "name", "device_count", "cuda_version")
                if getattr(self, key) is not None}

    def pytest_args(self) -> list[str]:
        """The pytest options that run a session under this device."""
        args = ["--emulate-cuda"]
        if self.total_memory is not None:
            args.append(f"--emulate-cuda-memory={format_size(self.total_memory)}")
        if self.name is not None:
            args.append(f"--emulate-cuda-name={self.name}")
        if self.device_count is not None:
            args.append(f"--emulate-cuda-count={self.device_count}")
        if self.cuda_version is not None:
            args.append(f"--emulate-cuda-version={self.cuda_version}")
        if self.schedule != DEFAULT_SCHEDULE:
            args.append(f"--cuda-schedule={self.schedule}")
        if self.races != DEFAULT_RACES:
            args.append(f"--cuda-races={self.races}")
        return args

    def updated(self, other: "EmulatedDevice | None", given: tuple[str, ...]) -> "EmulatedDevice":
        """This device with the fields named in `given` taken from `other` (what a user set
        explicitly wins over what a list or an ini file set)."""
        if other is None:
            return self
        return dataclasses.replace(self, **{key: getattr(other, key) for key in given})

    def __str__(self) -> str:
        parts = [f"total_memory={format_size(self.total_memory)}" if self.total_memory else "",
                 f"name={self.name!r}" if self.name else "",
                 f"device_count={self.device_count}" if self.device_count else "",
                 f"cuda_version={self.cuda_version!r}" if self.cuda_version else "",
                 f"schedule={self.schedule}" if self.schedule != DEFAULT_SCHEDULE else "",
                 f"races={self.races}" if self.races != DEFAULT_RACES else ""]
        return f"emulate_cuda({', '.join(p for p in parts if p)})"


LIST_KEYS = ("total_memory", "name", "device_count", "cuda_version", "schedule", "races")


def device_from_mapping(data: Any, *, where: str) -> EmulatedDevice | None:
    """A test-db block's `emulate_cuda` field: `true`, `false` or a mapping of LIST_KEYS."""
    if data is False or data is None:
        return None
    if data is True:
        return EmulatedDevice()
    if not isinstance(data, dict):
        raise DeviceOptionError(f"{where}: must be true, false or a mapping of {', '.join(LIST_KEYS)}; "
                                f"got {data!r}")
    unknown = sorted(set(map(str, data)) - set(LIST_KEYS))
    if unknown:
        raise DeviceOptionError(f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(LIST_KEYS)}")
    fields: dict[str, Any] = {}
    if "total_memory" in data:
        fields["total_memory"] = parse_size(data["total_memory"], where=f"{where}.total_memory")
    if "name" in data:
        fields["name"] = str(data["name"])
    if "device_count" in data:
        fields["device_count"] = parse_count(data["device_count"], where=f"{where}.device_count")
    if "cuda_version" in data:
        fields["cuda_version"] = parse_cuda_version(data["cuda_version"], where=f"{where}.cuda_version")
    if "schedule" in data:
        fields["schedule"] = parse_choice(data["schedule"], SCHEDULES, where=f"{where}.schedule")
    if "races" in data:
        fields["races"] = parse_choice(data["races"], RACE_MODES, where=f"{where}.races")
    return EmulatedDevice(**fields)


@dataclass(frozen=True)
class DeviceOverride:
    """What `harness run` was told about the emulated device: `emulate_all` puts every line under
    it; the fields named in `given` replace those of each line's own (a list's) device."""

    device: EmulatedDevice = EmulatedDevice()
    given: tuple[str, ...] = ()
    emulate_all: bool = False

    def apply(self, emulation: EmulatedDevice | None) -> EmulatedDevice | None:
        if emulation is None and not self.emulate_all:
            return None
        return (emulation or EmulatedDevice()).updated(self.device, self.given)
