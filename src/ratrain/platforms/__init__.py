"""Platform descriptions: compute and memory tiers of one compute unit, and the network
between units (within a node and across nodes).

Pure Python (no torch). Presets are YAML files beside this module; users write their own
with the same schema. Every number in a preset carries a note saying where it comes from
(``sourced: ...``) or why it was chosen (``assumed: ...``).

Schema (YAML), all sizes in bytes, bandwidths in bytes/s, times in seconds:

    name: mt3000
    description: ...
    usable_memory_bytes: {value: 20.0e9, note: "sourced: ..."}
    workspace_bytes:     {value: ..., note: ...}   # reserved for kernel workspaces
    headroom_fraction:   {value: 0.15, note: ...}  # optional (default 0): kept free by the
                                                   # planner for the allocator's fragmentation
    compute:
      peak_flops: {fp16: {value, note}, bf16: {...}, fp32: {...}}
      efficiency: {value, note}                    # achieved / peak for large GEMMs
    tiers:            # fastest first; the last is the unit's main memory (DDR / HBM)
      - {name: am, capacity_bytes: {...}, bandwidth_bytes_per_s: {...}, latency_s: {...}, copies: 24}
    host:             # the tier activations are offloaded to
      bandwidth_bytes_per_s: {...}
      latency_s: {...}
      same_memory: {value: true, note}   # optional: the host tier is main memory (CPUs)
    network:
      units_per_node: {...}
      intra_node: {bandwidth_bytes_per_s: {...}, latency_s: {...}, efficiency: {...}}
      inter_node: {bandwidth_bytes_per_s: {...}, latency_s: {...}, efficiency: {...}}
      algorithm: ring | tree | hierarchical
      collectives:    # optional, measured wall-time fits per collective and group size
        all_reduce: {value: [[n, alpha_s, bytes_per_s], ...], note: "measured: ..."}
      links:          # optional (ratrain.cost.links; ratrain link-probe writes it)
        full_duplex: {value: true, note}  # each direction its own resource (default true)
        notice_queue_s: {value: 0.05, note}  # a receive's notice waits behind its egress
        cpu_s_per_byte: {value: 4e-8, note}  # compute a byte carried takes from shared cores
        one_flow_bytes_per_s: {value, note}   # and the probe's other figures, for the record
    # Optional sections, written by `ratrain calibrate` (absent: not charged):
    compute:
      efficiency_curves:      # achieved / peak_flops[dtype] against a kernel's FLOPs
        gemm.fp32: {value: [[flops, efficiency], ...], note: ...}   # also gemm_bwd.*,
                                                                     # attention_fwd/bwd.*
      memory_bound_bytes_per_s:   # the model's memory-bound kernels, per op and dtype
        rmsnorm.fwd.fp32: {value, note}
      unit_time_factor:       # a unit's kernels inside the unit vs timed apart
        block.fwd.fp32: {value, note}     # also block.bwd.*, head.fwd.*, head.bwd.*, and a
                                          # split backward's halves block/head.bin/bw.*
      unit_fixed_s:           # seconds a unit's action takes beyond factor x kernels
        block.fwd.fp32: {value, note}     # keyed as unit_time_factor (one thread)
      rank_speed: {value: [[k, speed], ...], note}   # one of k ranks sharing the node
      shared_rank_speed: {value: [[w, b, speed], ...], note}  # b of w computing, w - b waiting
      collective_compute_s_per_byte: {value, note}   # compute a collective's CPU work takes
      cores_per_node: {value, note}       # cores the node's ranks share
      units_sharing_cores: {value, note}  # ranks sharing those cores, if not a node's
                                          # (an emulated network: all of them)
      thread_efficiency: {value, note}    # speed-up of each extra thread of one rank
    runtime:
      action_overhead_s: {F: {value, note}, B: ..., default: ...}   # fixed cost per action
      eager_kernels: {value: true, note}  # the ledger counts what eager kernels keep
      sends_held_until_waited: {value: true, note}  # a SEND's buffer lives to the step end
      waiting_ranks_lend_cores: {value: true, note}  # processor sharing (ratrain.sim.sharing)
    measured_on: {cpu: {value, note}, cores: {value, note}}   # warns on another host
      # optional: speed_probe_s {value, note}: the speed probe's time when calibrated

The loader (`ratrain.platforms.load`) turns this into the frozen dataclasses below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Tier", "Link", "Platform", "PLATFORM_PRESETS", "from_dict", "load"]


@dataclass(frozen=True)
class Tier:
    """One level of a compute unit's memory hierarchy."""

    name: str
    capacity_bytes: int
    """Capacity of one copy of this tier (e.g. one core's array memory)."""
    bandwidth_bytes_per_s: float
    """Bandwidth of moves between this tier and the next slower one, per copy."""
    latency_s: float = 0.0
    """Fixed cost of one move (DMA descriptor setup)."""
    copies: int = 1
    """How many independent copies a unit has (e.g. 24 cores each with its own AM)."""


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0
    """Achieved / nominal bandwidth for large messages."""


@dataclass(frozen=True)
class Platform:
    name: str
    usable_memory_bytes: int
    """The hard cap: bytes of main memory a training process may use per compute unit."""
    workspace_bytes: int
    """Reserved out of the cap for kernel workspace (and, where `headroom_fraction` is 0,
    the allocator's fragmentation)."""
    peak_flops: dict[str, float]
    """Per dtype (fp16, bf16, fp32): peak FLOP/s of one compute unit."""
    efficiency: float
    """Achieved / peak FLOP/s for the model's GEMMs (used when no tile model applies)."""
    tiers: tuple[Tier, ...]
    """Fastest first; the last is main memory."""
    host: Link
    """Main memory <-> host tier (activation offload)."""
    intra_node: Link
    inter_node: Link
    units_per_node: int
    collective_algorithm: str = "ring"
    efficiency_curves: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """Kernel kind and dtype ("gemm.fp32", "gemm_bwd.bf16", "attention_fwd.fp32", ...) ->
    (FLOPs, achieved / peak) points, FLOPs ascending; interpolated in log FLOPs."""
    memory_bound_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """The model's memory-bound kernels ("rmsnorm.fwd.bf16", ...): nominal bytes per second
    (bytes as `ratrain.cost.memory_bound` counts them). Empty: those kernels are free."""
    unit_time_factor: dict[str, float] = field(default_factory=dict)
    """A unit's kernels run inside the unit against their sum timed apart, per unit kind,
    direction and dtype ("block.fwd.fp32", "head.bwd.bf16"; `ratrain.calibrate.units`);
    directions "bin" and "bw" are a split backward's B_IN and B_W (absent: "bwd"'s,
    `ratrain.cost.measured.unit_factor`); absent: 1."""
    unit_fixed_s: dict[str, float] = field(default_factory=dict)
    """Seconds a unit's action takes beyond `unit_time_factor` x its kernels whatever its
    size, keyed as `unit_time_factor` (one thread: the cost model divides it by the rank's
    speed with the kernels; `ratrain.cost.measured.unit_fixed_s`); absent: 0."""
    cores_per_node: int | None = None
    """Cores shared by the compute of a node's ranks; None: each unit has its own."""
    units_sharing_cores: int | None = None
    """Ranks whose compute shares one set of cores (`cores_per_node`, `rank_speed`): a
    node's ranks (None: `units_per_node`), or all the ranks of an emulated network whose
    nodes are network namespaces of one machine (`ratrain emulate`, `ratrain.bench.cluster`),
    where the links are per node but the cores are the machine's."""

    @property
    def sharing_units(self) -> int:
        """Ranks that share one set of cores (`units_sharing_cores`, else a node's)."""
        return self.units_sharing_cores or self.units_per_node

    thread_efficiency: float = 1.0
    """Speed-up each extra thread brings to one rank's kernels (1.0: linear)."""
    headroom_fraction: float = 0.0
    """Of the memory left after the workspace, the part the planner keeps free: a caching
    allocator fragments, so a plan whose ledger peak sits at the cap fails in practice
    (`headroom_bytes`; `ratrain plan --headroom` overrides it)."""

    @property
    def headroom_bytes(self) -> int:
        """The headroom in bytes: `headroom_fraction` of the cap less the workspace."""
        return int(self.headroom_fraction * (self.usable_memory_bytes - self.workspace_bytes))

    @property
    def plan_limit_bytes(self) -> int:
        """What a stage's ledger peak may reach in a plan: the cap less the workspace and the
        headroom."""
        return self.usable_memory_bytes - self.workspace_bytes - self.headroom_bytes

    collective_compute_s_per_byte: float = 0.0
    """Compute time a byte of an overlapping all-reduce takes from the ranks (gloo's threads
    run on the cores they compute on; `ratrain.calibrate.sharing`); the simulator charges it
    to the compute action a stage runs while the collective is in flight
    (`ratrain.cost.model.CostModel.stolen_compute_s`). 0: not charged."""
    rank_speed: tuple[tuple[int, float], ...] = ()
    """Measured speed of one of k ranks sharing a node's cores (the launcher's threads each),
    relative to one thread on a core of its own: (k, speed), k ascending. Empty: derived
    from `cores_per_node` and `thread_efficiency` (`ratrain.cost.measured.compute_speed`)."""
    rank_speed_tokens: tuple[tuple[int, int, float], ...] = ()
    """Measured speed of one of k ranks whose launcher threads are more than one, per
    microbatch size: (k, tokens per microbatch, speed), as `rank_speed`. A rank's threads
    split each kernel, and a kernel over more tokens splits better (one rank with both cores
    of the 2-core reference machine: x1.44 at 128 tokens, x1.70 at 512). Interpolated in
    log tokens, held at the ends (`ratrain.cost.measured.compute_speed`); the k's without
    rows here keep `rank_speed`."""
    shared_rank_speed: tuple[tuple, ...] = ()
    """Measured speed of each of the b < w ranks of a node that compute while its other
    w - b ranks wait (blocked in a receive, as the executor waits), relative to one thread
    on a core of its own: (w, b, speed) or (w, b, speed, burst_s) (`ratrain.calibrate.sharing`). burst_s is
    how long each rank computed between waits (one thread's time), the busy set moving on
    after each burst the way a pipeline's does: a waiting rank's core goes to the others
    fully only when the busy set changes slowly (a row without it holds at any burst). Used by
    processor sharing (`ratrain.cost.sharing.shared_speed`) where present; empty: its
    formula."""
    eager_kernels: bool = False
    """The runtime on this machine runs eager fp32 norms (the ledger counts what they keep,
    `ratrain.sizes.activations`); False: fused norm kernels."""
    sends_held_until_waited: bool = False
    """A point-to-point send reports completion only when waited (gloo's isend), so the
    executor's poll never frees a SEND's buffer before the step's end; the ledger holds
    them that long. False: a send lands after the next compute action (NCCL, polled)."""
    host_is_main_memory: bool = False
    """The host tier is the unit's own main memory (a CPU: `host.same_memory`): activation
    offload moves nothing and frees nothing there, so `ratrain plan` does not try it."""
    waiting_ranks_lend_cores: bool = False
    """On a node whose ranks share its cores, a rank that waits gives its cores to the ranks
    that compute, so the simulator times compute with processor sharing
    (`ratrain.sim.sharing`); False: every rank keeps the all-busy speed (`rank_speed` at the
    node's rank count) for the whole step. Off unless a platform file says so (`ratrain
    calibrate` does on CPUs; docs/validation.md gives both models' figures)."""
    action_overhead_s: dict[str, float] = field(default_factory=dict)
    """Fixed cost of one IR action by op value ("F", "B", "SEND_F", ...; "default")."""
    collectives: dict[str, tuple[tuple[int, float, float], ...]] = field(default_factory=dict)
    link_full_duplex: bool = True
    """Each direction of a rank's inter-node link is its own resource (`network.links`,
    `ratrain.cost.links`); False: both directions share one."""
    link_notice_queue_s: float = 0.0
    """How long a standing queue of sends a node's link holds, in seconds of its rate
    (`network.links.notice_queue_s`, measured by `ratrain link-probe`): a receive's ready
    notice to its sender leaves through the receiver's egress behind what is queued there
    (`ratrain.schedule.rendezvous`). 0 (the default, assumed for the presets): the notice
    is not held up."""
    link_cpu_s_per_byte: float = 0.0
    """Compute seconds of one rank that a byte carried between nodes takes from the ranks
    sharing its cores (`network.links.cpu_s_per_byte`, measured by `ratrain link-probe`:
    the kernel's work on every packet, where the node's CPU does it, as on the emulated
    network's shaped links). While transfers run, the simulator counts it as load on the
    cores of both ends (`ratrain.sim.sharing`); it slows compute only where ranks share
    cores. 0 (the default, assumed for the presets): a NIC does that work."""
    link_measured: dict[str, float] = field(default_factory=dict)
    """What `ratrain link-probe` measured of the links (`network.links`), for the record."""
    measured_on: dict | None = None
    """{"cpu", "cores"} of the machine a calibrated file measured; loading it elsewhere warns
    (`ratrain.platforms.host`). "speed_probe_s" where calibrate timed its speed probe
    (`ratrain.calibrate.probe`; `ratrain validate` compares)."""
    """Measured intra-node collectives: kind -> (group size, α seconds, bytes/s) points."""
    notes: dict[str, str] = field(default_factory=dict)
    """Provenance of each value: dotted key -> 'sourced: ...' or 'assumed: ...'."""
    description: str = ""

    def overhead_s(self, op: str) -> float:
        """The fixed cost of one action of `op` (an IR op value). A split backward's halves
        (BI, BW) where the platform measured none: each is an action of its own on the
        walk, charged what an unsplit B's is (assumed; measured on the 2-core CPU VM
        `ratrain calibrate` ran on, BI was 1.4x B's and BW 0.9x)."""
        over = self.action_overhead_s
        if op in ("BI", "BW") and op not in over and "B" in over:
            return over["B"]
        return over.get(op, over.get("default", 0.0))

    @property
    def main_memory(self) -> Tier:
        return self.tiers[-1]


# After the dataclasses: the loader builds them.
from ratrain.platforms.load import PLATFORM_PRESETS, from_dict, load  # noqa: E402
