"""The measuring device: what it is (GPU, driver, torch and CUDA versions, memory, SMs), which machine
start timed a file (run_identity), its SM clock now, and the profiler's progress log.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import torch


def log(*a: Any) -> None:
    print(*a, flush=True)


def run_identity(device: torch.device) -> dict:
    """Which machine start timed a file: the GPU's UUID and the host's boot id (a fresh machine
    start is a new boot, often another GPU), so files of one start can be grouped as one run."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    uuid = str(torch.cuda.get_device_properties(0).uuid) if device.type == "cuda" else "cpu"
    return dict(gpu_uuid=uuid, boot_id=boot, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def gpu_info(device: torch.device) -> dict:
    if device.type != "cuda":
        return dict(gpu="cpu (dry run)", driver="n/a", torch=str(torch.__version__), cuda="n/a", mem_gib=16.0)
    p = torch.cuda.get_device_properties(0)
    try:
        drv = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except Exception as e:  # pragma: no cover
        drv = f"unknown ({e})"
    return dict(
        gpu=torch.cuda.get_device_name(0),
        driver=drv,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        mem_gib=round(p.total_memory / 2**30, 2),
        sms=p.multi_processor_count,
    )


def sm_clock_mhz(device: torch.device) -> int | None:
    """Current SM clock (NVML through torch), None where unavailable."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(0))
    except Exception:  # pragma: no cover
        return None
