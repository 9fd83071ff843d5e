"""`python -m agent manifest`: nothing under the outputs is dropped silently (a link or a fifo is
named, never followed), and a job stopped before its run (no outputs folder) has zero outputs,
while an outputs path that is a file stays an error."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any


def agent(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "agent", "manifest", *args],
                          capture_output=True, timeout=60)


def outputs(tmp: Path) -> Path:
    out = tmp / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"a")
    (tmp / "secret").write_bytes(b"not an output")
    (out / "escape").symlink_to(tmp / "secret")
    (out / "sub" / "rel").symlink_to("../a.txt")
    (out / "dir-link").symlink_to(tmp, target_is_directory=True)
    os.mkfifo(out / "pipe")
    return out


LINKS = [{"path": "dir-link", "link": None}, {"path": "escape", "link": None},
         {"path": "pipe", "special": "fifo"}, {"path": "sub/rel", "link": "../a.txt"}]


def others(entries: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    want = [dict(e) for e in LINKS]
    want[0]["link"], want[1]["link"] = str(tmp), str(tmp / "secret")
    assert [e for e in entries if "sha256" not in e] == want
    return want


def test_links_and_special_files_are_named_not_dropped(tmp_path: Path) -> None:
    out = outputs(tmp_path)
    done = agent(str(out))
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert [e["path"] for e in entries] == ["a.txt", "dir-link", "escape", "pipe", "sub/rel"]
    assert entries[0] == {"path": "a.txt", "size": 1, "sha256": hashlib.sha256(b"a").hexdigest()}
    others(entries, tmp_path)


def test_the_stream_names_links_in_its_manifest_and_sends_no_bytes_of_them(
        tmp_path: Path) -> None:
    out = outputs(tmp_path)
    saved = tmp_path / "saved.json"
    done = agent(str(out), "--tar", "--save", str(saved))
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        names = tar.getnames()
        sent = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert names == ["out/a.txt", "manifest.json"]
    assert sent == json.loads(saved.read_text())
    assert sent[0]["path"] == "a.txt" and sent[0]["sha256"] == hashlib.sha256(b"a").hexdigest()
    others(sent, tmp_path)
    changed = agent(str(out), "--unchanged-since", str(saved))
    problems = json.loads(changed.stdout)
    assert f"escape: a symbolic link to {tmp_path / 'secret'}, not a file: never read back" \
        in problems
    assert "pipe: a fifo, not a file: never read back" in problems and len(problems) == 4


def test_a_missing_outputs_folder_is_zero_outputs_but_a_file_is_an_error(
        tmp_path: Path) -> None:
    missing = tmp_path / "jobs" / "bench" / "workdir" / "out"
    assert json.loads(agent(str(missing)).stdout) == []
    saved = tmp_path / "saved.json"
    done = agent(str(missing), "--tar", "--save", str(saved))
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        assert tar.getnames() == ["manifest.json"]
    assert json.loads(saved.read_text()) == []
    assert json.loads(agent(str(missing), "--unchanged-since", str(saved)).stdout) == []
    a_file = tmp_path / "out"
    a_file.write_text("x")
    for args in ([], ["--tar", "--save", str(saved)], ["--unchanged-since", str(saved)]):
        bad = agent(str(a_file), *args)
        assert bad.returncode == 2 and b"is not a directory" in bad.stderr, bad.stderr
        assert bad.stdout == b""
    (tmp_path / "real").mkdir()
    link = tmp_path / "link-out"  # an outputs folder that is a link: never followed
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    bad = agent(str(link))
    assert bad.returncode == 2 and b"is not a directory" in bad.stderr
