"""A planner profile: the measured (or hand-written) costs of one workload, and its YAML form.

Every model of the planner reads a `Profile`; `measure.py` makes one from a run folder. Times are
in milliseconds."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

MS_PER_S = 1000.0

class PlannerError(ValueError):
    """A bad profile, layout or planner argument; the message names it and how to fix it."""



@dataclass(frozen=True)
class Profile:
    """Component costs of one workload (simulator + policy + hardware). All times in ms."""

    name: str
    """What was profiled (e.g. libero_pi05)."""
    step_ms: float
    """Median latency of one env step on one core (physics + rendering)."""
    step_sigma: float
    """Log-normal sigma of the env step latency (0 = constant; the tail makes lockstep slow)."""
    reset_ms: float
    """Extra latency of the step at which an episode ends (the env resets inside that step)."""
    episode_steps: int
    """Episode length in env steps (fixed: every env resets every episode_steps steps)."""
    infer_fixed_ms: float
    """Generator forward time = infer_fixed_ms + infer_per_sample_ms * samples (one GPU)."""
    infer_per_sample_ms: float
    """Per-sample part of the Generator forward time (one GPU)."""
    max_batch: int
    """Largest batch the Generator's model accepts (caps B_max)."""
    train_samples_per_s: float
    """Trainer throughput per GPU in samples/s (forward + backward + optimizer, all epochs)."""
    weight_sync_ms: float
    """Publishing a version: Trainer -> Generators weight transfer and load, once per rollout step."""
    cores_per_cpu_node: int
    """Cores of one CPU (Simulator) node."""
    gpus_per_node: int
    """GPUs of one GPU node; a plan fills whole nodes."""
    cores_per_env: float
    """CPU cores one env needs to run at step_ms (1/envs per Simulator core)."""
    request_overhead_ms: float = 0.0
    """Engine latency per request beyond batching and the forward (messages, polling): added
    to every round trip."""
    shard_delay_ms: float = 0.0
    """From a segment's end to its shard being announced to the Trainer (write + rename on the
    shared filesystem, on the Simulator's writer thread)."""
    # The site's network and filesystem (planner/network.py); 0 leaves a term out of the models.
    weights_mb: float = 0.0
    """Bytes of one publish on the wire (MB): what the Trainer broadcasts to every Generator.
    With weights_mb and net_gbps set, the broadcast is modelled and weight_sync_ms holds only the
    Trainer's gather and a Generator's load."""
    net_gbps: float = 0.0
    """Node-to-node bandwidth of one link, GB/s (one sender to one receiver)."""
    net_latency_us: float = 0.0
    """One message's latency between nodes, microseconds (each request crosses twice)."""
    net_bisection_gbps: float = 0.0
    """Total bandwidth all links can carry at once, GB/s (0: every link runs at net_gbps)."""
    message_us: float = 0.0
    """A Generator's CPU per request (receive, unpack, pack, reply), microseconds: bounds the
    requests per second one Generator can take."""
    sample_kb: float = 0.0
    """Shard bytes per sample (images compressed, proprio, tokens, sample), KB."""
    fs_mbps: float = 0.0
    """Shared filesystem bandwidth, MB/s, all clients together (shards are written once by the
    Simulators and read once by the Trainers)."""

    def __post_init__(self):
        positive = ("step_ms", "episode_steps", "max_batch", "train_samples_per_s", "cores_per_cpu_node",
                    "gpus_per_node", "cores_per_env")
        for name in positive:
            require(getattr(self, name) > 0, f"profile.{name}", getattr(self, name), "must be > 0")
        for name in ("step_sigma", "reset_ms", "infer_fixed_ms", "infer_per_sample_ms", "weight_sync_ms",
                     *OPTIONAL_FIELDS):
            require(getattr(self, name) >= 0, f"profile.{name}", getattr(self, name), "must be >= 0")


def require(ok: bool, name: str, value, fix: str) -> None:
    if not ok:
        raise PlannerError(f"{name}={value!r}: {fix}")


PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(Profile))
SITE_FIELDS = ("weights_mb", "net_gbps", "net_latency_us", "net_bisection_gbps", "message_us", "sample_kb", "fs_mbps")
"""The site's network and filesystem (0: not modelled; `network.ideal` zeroes them)."""
OPTIONAL_FIELDS = ("request_overhead_ms", "shard_delay_ms", *SITE_FIELDS)
"""Engine overheads and site terms a hand-written profile may leave out (0: an ideal engine)."""
_INT_FIELDS = ("episode_steps", "max_batch", "cores_per_cpu_node", "gpus_per_node")


def load_profile(path: str | Path) -> Profile:
    """A Profile from YAML (safe_load: data only). Unknown or missing keys fail, naming them."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    require(isinstance(data, dict), "profile file", str(path), "must be a YAML mapping of Profile fields")
    unknown = sorted(set(data) - set(PROFILE_FIELDS))
    missing = sorted(set(PROFILE_FIELDS) - set(data) - set(OPTIONAL_FIELDS))
    require(not unknown, f"profile {path}", unknown, f"unknown keys; the fields are {list(PROFILE_FIELDS)}")
    require(not missing, f"profile {path}", missing, "missing keys")
    values = {}
    for name in PROFILE_FIELDS:
        if name not in data:
            continue  # an optional field: the schema's default
        v = data[name]
        if name == "name":
            values[name] = str(v)
            continue
        require(isinstance(v, (int, float)) and not isinstance(v, bool), f"profile.{name}", v, "must be a number")
        if name in _INT_FIELDS:
            require(float(v).is_integer(), f"profile.{name}", v, "must be an integer")
            v = int(v)
        values[name] = v
    return Profile(**values)


def save_profile(profile: Profile, path: str | Path) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False))
