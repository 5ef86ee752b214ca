"""Which file system a path lives on: the tools print it beside their figures (fsync
cost is the point of most of them, and a RAM file system makes it nearly free)."""

from __future__ import annotations

import os


def mount_of(path: str) -> tuple[str, str]:
    """(mount point, file system type) of the longest mount prefix of `path`, from
    /proc/mounts; ("", "?") where that cannot be read."""
    path = os.path.realpath(path)
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, fstype = mnt, parts[2]
    except (OSError, IndexError):
        pass
    return best, fstype


def fs_info(path: str, beside: str | None = None) -> dict[str, object]:
    """`mount_of` as a dict, and with `beside`: whether `path` is on the same device."""
    mount, fstype = mount_of(path)
    out: dict[str, object] = {"path": os.path.realpath(path), "mount": mount, "fstype": fstype}
    if beside is not None:
        out["same_fs"] = os.stat(path).st_dev == os.stat(beside).st_dev
    return out
