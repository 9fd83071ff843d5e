"""Card names: the fleet speaks Vast's short names; RunPod speaks GPU type ids and display names.

The one table that maps them. A RunPod type missing here passes through under its own id, so an
unknown card is shown as RunPod names it rather than dropped. What an operator writes (fleet.toml's
roster, a `--card` option) goes through `canonical`: any spelling of a known card becomes the
fleet's name, and an unknown card is refused.
"""

from __future__ import annotations

from typing import NamedTuple

NVIDIA = "nvidia"
AMD = "amd"
VENDORS = (NVIDIA, AMD)


class Card(NamedTuple):
    fleet: str  # Vast's gpu_name, the fleet's name: "H100 SXM"
    runpod_id: str  # RunPod gpuTypeId: "NVIDIA H100 80GB HBM3"
    runpod_display: str  # RunPod displayName / machine.gpuDisplayName: "H100 SXM"
    vendor: str = NVIDIA  # whose library admits it: NVML (nvidia) or AMD SMI (amd)
    aliases: tuple[str, ...] = ()  # other spellings an operator may write


CARDS: tuple[Card, ...] = (
    Card("RTX 3080", "NVIDIA GeForce RTX 3080", "RTX 3080"),
    Card("RTX 3090", "NVIDIA GeForce RTX 3090", "RTX 3090"),
    Card("RTX 4070", "NVIDIA GeForce RTX 4070", "RTX 4070"),
    Card("RTX 4090", "NVIDIA GeForce RTX 4090", "RTX 4090"),
    Card("RTX 5090", "NVIDIA GeForce RTX 5090", "RTX 5090"),
    Card("RTX A4000", "NVIDIA RTX A4000", "RTX A4000"),
    Card("RTX A5000", "NVIDIA RTX A5000", "RTX A5000"),
    Card("RTX A6000", "NVIDIA RTX A6000", "RTX A6000"),
    Card("RTX 6000Ada", "NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    Card("L4", "NVIDIA L4", "L4"),
    Card("L40", "NVIDIA L40", "L40"),
    Card("L40S", "NVIDIA L40S", "L40S"),
    Card("A40", "NVIDIA A40", "A40"),
    Card("A100 PCIE", "NVIDIA A100 80GB PCIe", "A100 PCIe"),
    Card("A100 SXM4", "NVIDIA A100-SXM4-80GB", "A100 SXM"),
    Card("H100 PCIE", "NVIDIA H100 PCIe", "H100 PCIe"),
    Card("H100 SXM", "NVIDIA H100 80GB HBM3", "H100 SXM"),
    Card("H100 NVL", "NVIDIA H100 NVL", "H100 NVL"),
    Card("H200", "NVIDIA H200", "H200 SXM"),
    Card("B200", "NVIDIA B200", "B200"),
    # AMD: Vast's gpu_name; RunPod's gpuTypeId is AMD's full market name
    Card("RX 7900 XTX", "AMD Radeon RX 7900 XTX", "RX 7900 XTX", AMD,
         ("Radeon RX 7900 XTX", "7900 XTX")),
    Card("PRO W7900", "AMD Radeon PRO W7900", "W7900", AMD, ("Radeon PRO W7900",)),
    Card("MI210", "AMD Instinct MI210", "MI210", AMD, ("Instinct MI210",)),
    Card("MI250X", "AMD Instinct MI250X", "MI250X", AMD, ("Instinct MI250X",)),
    Card("MI300X", "AMD Instinct MI300X OAM", "MI300X", AMD,
         ("Instinct MI300X", "AMD Instinct MI300X")),
)

_BY_FLEET = {c.fleet.lower(): c for c in CARDS}
_BY_RUNPOD = {c.runpod_id.lower(): c for c in CARDS}
_BY_RUNPOD_DISPLAY = {c.runpod_display.lower(): c for c in CARDS}


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


# every spelling an operator may write for a card: the fleet's name, RunPod's gpuTypeId and
# RunPod's display name (case and runs of whitespace aside)
_BY_ANY = {_key(n): c.fleet for c in CARDS
           for n in (c.runpod_display, c.runpod_id, c.fleet, *c.aliases)}


def canonical(name: str) -> str | None:
    """The fleet's name for a card however it is spelled (the fleet's name, RunPod's gpuTypeId
    or display name; any case, extra whitespace): `"nvidia geforce rtx 4090"` is `"RTX 4090"`.
    None for a card the table does not know."""
    return _BY_ANY.get(_key(name))


def vendor(card: str) -> str | None:
    """"nvidia" or "amd" for a card in any spelling; None for a card the table does not know
    (whose library would admit it cannot be told)."""
    name = canonical(card)
    return None if name is None else _BY_FLEET[name.lower()].vendor


def known() -> str:
    """The fleet's card names, for an error line."""
    return ", ".join(c.fleet for c in CARDS)


def runpod_type_id(card: str) -> str:
    """RunPod's gpuTypeId for a fleet card name; a RunPod id given as is passes through."""
    c = _BY_FLEET.get(card.lower())
    return c.runpod_id if c else card


def from_runpod(type_id_or_display: str | None) -> str:
    """The fleet's card name for a RunPod gpuTypeId or display name."""
    if not type_id_or_display:
        return ""
    key = type_id_or_display.lower()
    c = _BY_RUNPOD.get(key) or _BY_RUNPOD_DISPLAY.get(key) or _BY_FLEET.get(key)
    return c.fleet if c else type_id_or_display
