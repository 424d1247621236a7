"""What a profile asks for: its targets, its kind and its limits."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_FREQUENCY = 99
DEFAULT_MIN_BLOCK_MS = 1.0  # the broker's default (broker/request/params.py)
# --wall's default: a thread preempted for less than 1 ms, many times, would
# lose that share of its wall-clock time (the broker's own floor is 0.1 ms).
WALL_MIN_BLOCK_US = 100
# ProfileRequest.mode values: CPU samples (or calls at --stacks-at), off-CPU time, both as time;
# bytes allocated per stack (--memory, --memory-live).
CPU, OFF_CPU, WALL, MEMORY = "cpu", "off-cpu", "wall", "memory"
LOCKS = "locks"  # time waiting on user-space locks, per lock (program locks)
GPU = "gpu"  # device ns per launch stack and kernel (program cudakernels; profile --gpu)


@dataclass
class ProfileRequest:
    """One profile: which processes (pids, or a command to run), and what of them."""

    pids: list[int]
    command: list[str]
    library: str | None = None  # --stacks-at: count calls of functions in it
    functions: list[str] = field(default_factory=list)
    weight: str = "calls"  # --stacks-at: "calls" or "time"
    frequency: int = DEFAULT_FREQUENCY
    children: bool = True  # follow the targets' descendants (--no-children: False)
    mode: str = CPU  # CPU, OFF_CPU (--off-cpu) or WALL (--wall)
    min_block_us: int = 0  # --min-block; 0: the broker's default
    min_block_asked: bool = False  # given by --min-block (else --wall may retry higher)
    scope: str | None = None  # None: the policy's scope
    stack_bytes: int = 0  # stack bytes per copy; 0: the broker's default
    job: str = ""  # --job: a Slurm job's processes on this node (scope job)
    wakers: bool = False  # --off-cpu --wakers: each wait joined with its waker (program offwake)
    live: bool = False  # MEMORY: bytes still held at the end (--memory-live)
    cuda: bool = False  # MEMORY: device memory, in the target's libcuda (--cuda)
    sample_bytes: int = 0  # MEMORY: record one allocation per this many bytes; 0: all

    @property
    def timed(self) -> bool:
        """Weighed in nanoseconds of wall-clock time (off-CPU or wall)."""
        return self.mode not in (CPU, MEMORY, GPU)

    @property
    def probes(self) -> bool:
        return self.library is not None

    @property
    def own_processes(self) -> bool:
        """Scope self (or job, the user's processes in one job): stack copies and
        Python walks read process memory, so only there."""
        return self.scope in (None, "self", "job")

    @property
    def own_scope(self) -> str:
        """The scope of programs that read process memory: job with --job, else self."""
        return "job" if self.job else "self"

    @property
    def job_params(self) -> dict[str, str]:
        """The attach keywords that name the job (none without --job)."""
        return {"job": self.job} if self.job else {}
