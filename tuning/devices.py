"""GPUs by the names the engines read their fused-MoE config files under, and their compute
capability.

Both engines name a config file for the GPU's name as the driver gives it, spaces made "_":
vLLM 0.34 from NVML (`CudaPlatform.get_device_name`, then `get_device_name_as_file_name`
replaces each run of blanks or "/" by "_"), SGLang 0.5.23 from torch
(`torch.cuda.get_device_name`, then `.replace(" ", "_")`). For the GPUs here the two agree; one
GPU model may come under several names (the RTX PRO 6000 Blackwell's editions), each reading a
file of its own. Pure Python: the web tier reads it for the kernel page.
"""

from __future__ import annotations

# The RTX PRO 6000 Blackwell (compute capability 12.0, 99 KiB of shared memory a block may opt
# into) under the names its editions report; both engines ship files under each of them.
RTX_PRO_6000_BLACKWELL = (
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
)

# Compute capability (as Triton writes it: 120 for 12.0) of the GPUs moeops meets by name.
CAPABILITIES = {
    **dict.fromkeys(RTX_PRO_6000_BLACKWELL, 120),
    "NVIDIA GeForce RTX 5090": 120,
    "NVIDIA B200": 100,
    "NVIDIA H100 80GB HBM3": 90,
    "NVIDIA H100 PCIe": 90,
    "NVIDIA H100 NVL": 90,
    "NVIDIA H200": 90,
    "NVIDIA H200 NVL": 90,
    "NVIDIA H20": 90,
    "NVIDIA L40S": 89,
    "NVIDIA GeForce RTX 4090": 89,
    "NVIDIA A100-SXM4-80GB": 80,
    "NVIDIA A100-SXM4-40GB": 80,
    "NVIDIA A100 80GB PCIe": 80,
}

# The GPUs whose names compile-check writes a capability's files under unless told otherwise:
# those a team runs MoE serving on and the engines ship no file for at every shape.
FILE_DEVICES = {120: RTX_PRO_6000_BLACKWELL}


def capability_of(device_name: str) -> int | None:
    """The compute capability of the GPU of that NVML name (120 for 12.0), None if unknown."""
    return CAPABILITIES.get(device_name.strip())


def capability_text(capability: int) -> str:
    """120 → "12.0"."""
    return f"{capability // 10}.{capability % 10}"


def same_gpu(device_name: str) -> tuple[str, ...]:
    """The names the GPU of device_name comes under (its editions), itself first; (name,)
    for a GPU of one name."""
    for names in (RTX_PRO_6000_BLACKWELL,):
        if device_name in names:
            return (device_name, *(n for n in names if n != device_name))
    return (device_name,)
