"""One dataclass per config namespace; `ServerArgs` composes them."""

from __future__ import annotations

from sglang.srt.arg_groups.arg_utils import Derived, arg, derived_of, namespace_of
from sglang.srt.arg_groups.device import DeviceArgs
from sglang.srt.arg_groups.disagg import DisaggArgs
from sglang.srt.arg_groups.exec_ import ExecArgs, ExecFeaturesArgs, ExecGraphArgs, ExecKernelArgs
from sglang.srt.arg_groups.lora import LoraArgs
from sglang.srt.arg_groups.memory import MemoryArgs
from sglang.srt.arg_groups.mm import MultimodalArgs
from sglang.srt.arg_groups.model import ModelArgs
from sglang.srt.arg_groups.observability import ObservabilityArgs
from sglang.srt.arg_groups.parallel import ParallelArgs
from sglang.srt.arg_groups.schedule import ScheduleArgs
from sglang.srt.arg_groups.serving import ServingArgs
from sglang.srt.arg_groups.spec import SpecArgs

# Order of the CLI's argument groups and of ServerArgs' fields.
NAMESPACE_GROUPS: tuple[type, ...] = (
    DeviceArgs,
    ModelArgs,
    ParallelArgs,
    ExecArgs,
    ExecKernelArgs,
    ExecGraphArgs,
    ExecFeaturesArgs,
    ScheduleArgs,
    MemoryArgs,
    SpecArgs,
    LoraArgs,
    MultimodalArgs,
    DisaggArgs,
    ServingArgs,
    ObservabilityArgs,
)

__all__ = [
    "NAMESPACE_GROUPS",
    "Derived",
    "arg",
    "derived_of",
    "namespace_of",
    "DeviceArgs",
    "DisaggArgs",
    "ExecArgs",
    "ExecFeaturesArgs",
    "ExecGraphArgs",
    "ExecKernelArgs",
    "LoraArgs",
    "MemoryArgs",
    "ModelArgs",
    "MultimodalArgs",
    "ObservabilityArgs",
    "ParallelArgs",
    "ScheduleArgs",
    "ServingArgs",
    "SpecArgs",
]
