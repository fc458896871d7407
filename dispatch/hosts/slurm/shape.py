"""The declared shape of a Slurm cluster's report (``dispatch.hosts.slurm.report``; the keys'
meanings: docs/slurm.md, "Report and placement"). Its ``slice`` and ``settings`` say what the shared
rules need of any host (the largest node's memory is the most one job could ever have, the roomiest
node's free memory is what it could have now), not that a cluster has a slice.

Type-checking only, as ``dispatch.core.reportshape``.
"""

from __future__ import annotations

from typing import Literal, Optional, TypedDict

from dispatch.core.reportshape import QueuedJob, Report, Room, RoomSettings, RunningJob


class ClusterJob(RunningJob):
    state: str
    nodes: Optional[str]


class NodeMemory(TypedDict):
    total: int
    allocated: int
    free: int


class NodeCpus(TypedDict):
    total: int
    allocated: int


class NodeGpus(TypedDict):
    total: int
    used: Optional[int]


class Node(TypedDict):
    name: str
    state: str
    usable: bool
    partitions: list[str]
    memory: NodeMemory
    cpus: NodeCpus
    gpus: NodeGpus
    gres: Optional[str]
    reason: Optional[str]


class NamedSize(TypedDict):
    name: str
    memory: int


class ClusterTotals(TypedDict):
    nodes: int
    nodes_up: int
    memory_total: int
    memory_allocated: int
    memory_free: int
    cpus_total: int
    cpus_allocated: int
    gpus_total: int
    largest_node: Optional[NamedSize]
    most_free_node: Optional[NamedSize]


class DefaultMem(TypedDict):
    per_node: Optional[int]
    per_cpu: Optional[int]


class ClusterReport(Report):
    slice: Room
    settings: RoomSettings
    running: list[ClusterJob]
    queue: list[QueuedJob]
    kind: Literal["slurm"]
    slurm_version: Optional[str]
    partition: Optional[str]
    partitions: list[str]
    default_mem: DefaultMem
    nodes: list[Node]
    totals: ClusterTotals
