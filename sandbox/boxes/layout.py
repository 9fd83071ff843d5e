"""Where a box lives on the operator's disk.

```
<state>/network.json         the bridge this backend made (for sweep)
<state>/image/               the image layer, over the host's root in every NVIDIA box: the
                             stand-in libnvidia-ml.so.1 in the library dir, the image's /start.sh
<state>/image-amd/           the same for AMD boxes, with the stand-in libamd_smi.so and
                             librocm-core.so in /opt/rocm/lib instead of NVML
<state>/<box_id>/
  box.json                   runtime record: init pid, veth, address, ports (for sweep)
  init.marshal               what the box's init needs: hostname, mount sources, hidden paths
  sys/                       read-only at /run/sandbox in the box: sshd_config,
                             authorized_keys, nvml.json (amdsmi.json), start-hook.sh (the host
                             key is the box's own, in /etc/ssh on its disk)
  disk.img, disk/            the box's disk (sparse ext4 of its size; a tmpfs without loop
                             devices), mounted at disk/: upper/ and work/, its root's layers
  volume.img, volume/        a RunPod pod volume, when it has one: volume/data at its mount path
  rootfs/                    where the init mounts the box's root before pivoting into it
  log/init.log, log/sshd.log the container's logs, outside the box
```
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.boxes.errors import BoxError

IMAGE = "image"  # in the state dir: the image layer
IMAGES = {"nvidia": IMAGE, "amd": "image-amd"}  # one layer per GPU vendor
_BOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Overlay mount options are comma/colon separated, so these may not appear in state paths.
_BAD_PATH_CHARS = set(",:\\\n")


def check_state_dir(state_dir: Path) -> Path:
    state_dir = state_dir.resolve()
    if _BAD_PATH_CHARS & set(str(state_dir)):
        raise BoxError(f"state dir {state_dir} may not contain any of , : \\ or a newline")
    return state_dir


@dataclass(frozen=True)
class BoxPaths:
    root: Path

    @classmethod
    def of(cls, state_dir: Path, box_id: str) -> BoxPaths:
        if not _BOX_ID.match(box_id):
            raise BoxError(f"box id {box_id!r}: use letters, digits, '.', '_' or '-'")
        return cls(state_dir / box_id)

    @property
    def record(self) -> Path:
        return self.root / "box.json"

    @property
    def init_config(self) -> Path:
        return self.root / "init.marshal"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def nvml_config(self) -> Path:
        return self.sys / "nvml.json"

    @property
    def amdsmi_config(self) -> Path:
        return self.sys / "amdsmi.json"

    @property
    def disk(self) -> Path:
        return self.root / "disk"

    @property
    def disk_image(self) -> Path:
        return self.root / "disk.img"

    @property
    def upper(self) -> Path:
        return self.disk / "upper"

    @property
    def work(self) -> Path:
        return self.disk / "work"

    @property
    def layer(self) -> Path:
        """The disk's copy of the image layer."""
        return self.disk / IMAGE

    @property
    def volume(self) -> Path:
        return self.root / "volume"

    @property
    def volume_image(self) -> Path:
        return self.root / "volume.img"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    @property
    def log(self) -> Path:
        return self.root / "log"

    def make(self) -> None:
        for d in (self.sys, self.log, self.rootfs):
            d.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # nothing of a box is for the host's other users


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temporary file beside `path` and rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
