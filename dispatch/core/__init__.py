"""The vocabulary every part uses: exit codes, errors, outcomes, requests, records, units, settings.

Standard library only; shipped to peers.
"""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "Alert": "dispatch.core.alertshape",
    "AdmissionEngine": "dispatch.core.reportshape",
    "BackendError": "dispatch.core.errors",
    "Block": "dispatch.core.view",
    "DEFAULT_RESERVE_TEXT": "dispatch.core.sliceadvice",
    "ExitCode": "dispatch.core.exitcodes",
    "GPU_AUTO": "dispatch.core.runoptions",
    "Gauge": "dispatch.core.view",
    "HostSettings": "dispatch.core.settings",
    "HostrunError": "dispatch.core.errors",
    "LOCAL": "dispatch.core.settings",
    "Line": "dispatch.core.view",
    "LongJobError": "dispatch.core.errors",
    "NOT_FOUND": "dispatch.core.exitcodes",
    "NamedTuple": "dispatch.core.records",
    "NoSliceError": "dispatch.core.errors",
    "Outcome": "dispatch.core.outcome",
    "PROG": "dispatch.core.runoptions",
    "RUN_OPTIONS": "dispatch.core.runoptions",
    "SUBCOMMANDS": "dispatch.core.runoptions",
    "RunOptions": "dispatch.core.runoptions",
    "RunRequest": "dispatch.core.request",
    "Settings": "dispatch.core.settings",
    "Span": "dispatch.core.view",
    "UsageError": "dispatch.core.errors",
    "cap_size": "dispatch.core.runoptions",
    "check_name": "dispatch.core.text",
    "check_result_path": "dispatch.core.outcome",
    "checked_name": "dispatch.core.runoptions",
    "default_reserve": "dispatch.core.sliceadvice",
    "duration": "dispatch.core.runoptions",
    "enclosing_job": "dispatch.core.request",
    "exec_failure": "dispatch.core.exitcodes",
    "format_duration": "dispatch.core.units",
    "format_size": "dispatch.core.units",
    "has_nvidia_gpus": "dispatch.core.hostfacts",
    "interrupted": "dispatch.core.exitcodes",
    "is_alive": "dispatch.core.procinfo",
    "outcome_name": "dispatch.core.exitcodes",
    "parse_duration": "dispatch.core.units",
    "parse_run_options": "dispatch.core.runoptions",
    "printable": "dispatch.core.text",
    "read_meminfo": "dispatch.core.hostfacts",
    "resolve_session": "dispatch.core.runoptions",
    "split_command": "dispatch.core.runoptions",
    "storable": "dispatch.core.text",
    "whole_number": "dispatch.core.runoptions",
    "write_result": "dispatch.core.outcome",
}
__all__ = [
    "DEFAULT_RESERVE_TEXT",
    "GPU_AUTO",
    "LOCAL",
    "NOT_FOUND",
    "PROG",
    "RUN_OPTIONS",
    "SUBCOMMANDS",
    "AdmissionEngine",
    "Alert",
    "BackendError",
    "Block",
    "ExitCode",
    "Gauge",
    "HostSettings",
    "HostrunError",
    "Line",
    "LongJobError",
    "NamedTuple",
    "NoSliceError",
    "Outcome",
    "RunOptions",
    "RunRequest",
    "Settings",
    "Span",
    "UsageError",
    "cap_size",
    "check_name",
    "check_result_path",
    "checked_name",
    "default_reserve",
    "duration",
    "enclosing_job",
    "exec_failure",
    "format_duration",
    "format_size",
    "has_nvidia_gpus",
    "interrupted",
    "is_alive",
    "outcome_name",
    "parse_duration",
    "parse_run_options",
    "printable",
    "read_meminfo",
    "resolve_session",
    "split_command",
    "storable",
    "whole_number",
    "write_result",
]
MYPY = False
if MYPY:
    from dispatch.core.alertshape import Alert as Alert
    from dispatch.core.errors import BackendError as BackendError
    from dispatch.core.errors import HostrunError as HostrunError
    from dispatch.core.errors import LongJobError as LongJobError
    from dispatch.core.errors import NoSliceError as NoSliceError
    from dispatch.core.errors import UsageError as UsageError
    from dispatch.core.exitcodes import NOT_FOUND as NOT_FOUND
    from dispatch.core.exitcodes import ExitCode as ExitCode
    from dispatch.core.exitcodes import exec_failure as exec_failure
    from dispatch.core.exitcodes import interrupted as interrupted
    from dispatch.core.exitcodes import outcome_name as outcome_name
    from dispatch.core.hostfacts import has_nvidia_gpus as has_nvidia_gpus
    from dispatch.core.hostfacts import read_meminfo as read_meminfo
    from dispatch.core.outcome import Outcome as Outcome
    from dispatch.core.outcome import check_result_path as check_result_path
    from dispatch.core.outcome import write_result as write_result
    from dispatch.core.procinfo import is_alive as is_alive
    from dispatch.core.records import NamedTuple as NamedTuple
    from dispatch.core.reportshape import AdmissionEngine as AdmissionEngine
    from dispatch.core.request import RunRequest as RunRequest
    from dispatch.core.request import enclosing_job as enclosing_job
    from dispatch.core.runoptions import GPU_AUTO as GPU_AUTO
    from dispatch.core.runoptions import PROG as PROG
    from dispatch.core.runoptions import RUN_OPTIONS as RUN_OPTIONS
    from dispatch.core.runoptions import SUBCOMMANDS as SUBCOMMANDS
    from dispatch.core.runoptions import RunOptions as RunOptions
    from dispatch.core.runoptions import cap_size as cap_size
    from dispatch.core.runoptions import checked_name as checked_name
    from dispatch.core.runoptions import duration as duration
    from dispatch.core.runoptions import parse_run_options as parse_run_options
    from dispatch.core.runoptions import resolve_session as resolve_session
    from dispatch.core.runoptions import split_command as split_command
    from dispatch.core.runoptions import whole_number as whole_number
    from dispatch.core.settings import LOCAL as LOCAL
    from dispatch.core.settings import HostSettings as HostSettings
    from dispatch.core.settings import Settings as Settings
    from dispatch.core.sliceadvice import DEFAULT_RESERVE_TEXT as DEFAULT_RESERVE_TEXT
    from dispatch.core.sliceadvice import default_reserve as default_reserve
    from dispatch.core.text import check_name as check_name
    from dispatch.core.text import printable as printable
    from dispatch.core.text import storable as storable
    from dispatch.core.units import format_duration as format_duration
    from dispatch.core.units import format_size as format_size
    from dispatch.core.units import parse_duration as parse_duration
    from dispatch.core.view import Block as Block
    from dispatch.core.view import Gauge as Gauge
    from dispatch.core.view import Line as Line
    from dispatch.core.view import Span as Span

__getattr__ = lazy_attributes(__name__, SURFACE)
