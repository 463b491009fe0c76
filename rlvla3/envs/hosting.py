"""How a Simulator hosts envs: one env as an `Episode`, a group of them in-process or one spawned
child process per env, and `make_vec_env`, which picks between the two.

`Episode` wraps one env: executes an action chunk (K actions, one env step each, stopping at
episode end), counts steps, truncates at the horizon, auto-resets at episode end (timing the
reset apart from the step), draws per-episode seeds, and turns an exception in the env into a
truncated episode (counted) instead of a crash. Episodic mode (grpo): no auto-reset; an ended
episode ignores further chunks until the group resets all its envs with one shared seed.

A group (`LocalVecEnv` in-process, `ProcessVecEnv` one spawned child per env) is driven
without blocking: start_step(actions) ... ready() ... result(). A child that exceeds the step or
reset timeout, or dies, is killed and restarted; its episode is marked truncated.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from .. import notices
from . import SIM_MODULES, SOURCE_ROOT, env_dims, in_process, interpreter, make_env
from .base import Obs, StepOut
from .choices import CHECKS
from .wire import WireConnection, config_tree


def episode_seed(base: int, env_id: int, episode: int, num_envs: int, order: str = "hashed") -> int:
    """The reset seed of env `env_id`'s `episode`-th episode. `hashed` spreads seeds apart;
    `sequential` numbers every episode of the run base, base+1, ... (env 0's first, env 1's first,
    ..., env 0's second, ...): an evaluation protocol that must visit each of N initial states
    once runs N episodes from seeds 0..N-1."""
    if order == "sequential":
        return base + env_id + num_envs * episode
    return (base * 1_000_003 + env_id * 10_007 + episode) % (2**31 - 1)


class Episode:
    """One env with horizon, chunk execution, auto-reset and error containment."""

    def __init__(self, cfg, env_id: int, seed: int, auto_reset: bool):
        self.env = make_env(cfg, env_id)
        self.horizon = cfg.env.horizon
        self.auto_reset = auto_reset
        self.env_id, self.seed = env_id, seed
        self.num_envs, self.seed_order = cfg.env.num_envs, cfg.env.seed_order
        self.episode, self.t = 0, 0
        self.ended = False
        self.last_obs: Obs | None = None

    def reset(self, seed: int | None = None) -> Obs:
        """Start an episode: from `seed` when given (grpo: one seed for a whole group), else from
        this env's own per-episode seed."""
        self.t, self.ended = 0, False
        if seed is None:
            seed = episode_seed(self.seed, self.env_id, self.episode, self.num_envs, self.seed_order)
        obs = self.env.reset(seed)
        obs.reset_seed = seed
        self.episode += 1
        self.last_obs = obs
        return obs

    def step(self, actions: np.ndarray | None) -> StepOut:
        """Execute the chunk `actions` [K, A] (or one action [A]) until it ends or the episode does.
        None: one step of the env's scripted expert (demonstrations); StepOut.actions says what ran."""
        expert = actions is None
        chunk = [None] if expert else np.asarray(actions, np.float32).reshape(-1, np.shape(actions)[-1])
        if self.ended:   # episodic: wait for the group's reset
            return StepOut(self.last_obs, 0.0, False, False, False, False, 0.0, 0.0, 0.0, steps=0)
        reward = delay = step_s = 0.0
        obs, terminated, truncated, success, error, steps = self.last_obs, False, False, False, False, 0
        ran = []
        for i, action in enumerate(chunk):
            t0 = time.perf_counter()
            # Only the chunk's last observation (or the horizon's) is looked at: envs skip drawing the rest.
            observe = i == len(chunk) - 1 or self.t + 1 >= self.horizon
            try:
                action = np.clip(self.env.expert_action() if expert else action, -1.0, 1.0)
                ran.append(action)
                obs, r, terminated, success, d = self.env.step(action, observe=observe)
            except Exception:
                traceback.print_exc()
                obs, r, terminated, success, d, error = self.last_obs, 0.0, False, False, 0.0, True
            step_s += time.perf_counter() - t0
            reward, delay, steps, self.t = reward + r, delay + d, steps + 1, self.t + 1
            truncated = error or (not terminated and self.t >= self.horizon)
            self.last_obs = obs
            if terminated or truncated:
                break
        reset_s = 0.0
        if terminated or truncated:
            if self.auto_reset:
                t1 = time.perf_counter()
                obs = self.reset()
                reset_s = time.perf_counter() - t1
                delay += getattr(self.env, "reset_delay", 0.0)
            else:
                self.ended = True
        return StepOut(obs, float(reward), bool(terminated), bool(truncated), bool(success), error,
                       step_s, reset_s, delay, steps, np.array(ran, np.float32) if expert else None)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close:
            close()


@dataclass
class GroupStep:
    """Result of one step of a whole group, arrays over its n envs."""

    images: np.ndarray
    proprio: np.ndarray
    tokens: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    errors: int
    env_steps: np.ndarray    # int16 [n]: env steps each env executed
    actions: np.ndarray | None   # expert steps: float32 [n, A] the experts' actions (0 if none ran)
    step_s: float            # max over envs
    reset_s: float           # sum over envs that reset
    reset_seeds: np.ndarray  # int64 [n]: each env's reset seed where this result starts an episode, else -1
    instructions: list[str]  # [n]: each env's instruction text (the tokens encode it)


class _GroupBase:
    def __init__(self, cfg, env_ids: list[int], seed: int, auto_reset: bool, encode):
        self.cfg, self.env_ids, self.seed, self.auto_reset = cfg, list(env_ids), seed, auto_reset
        self.action_dim = env_dims(cfg).action_dim
        self.encode = encode
        self._tok: dict[str, np.ndarray] = {}

    def tokens(self, text: str, proprio: np.ndarray) -> np.ndarray:
        if getattr(self.encode, "reads_state", False):   # the prompt holds the state: a new one each step
            return self.encode(text, proprio)
        if text not in self._tok:
            self._tok[text] = self.encode(text)
        return self._tok[text]

    def gather(self, outs: list[StepOut]) -> GroupStep:
        return GroupStep(
            images=np.stack([o.obs.images for o in outs]),
            proprio=np.stack([o.obs.proprio for o in outs]).astype(np.float32),
            tokens=np.stack([self.tokens(o.obs.instruction, o.obs.proprio) for o in outs]),
            reward=np.array([o.reward for o in outs], np.float32),
            terminated=np.array([o.terminated for o in outs]),
            truncated=np.array([o.truncated for o in outs]),
            success=np.array([o.success for o in outs]),
            errors=sum(o.error for o in outs),
            env_steps=np.array([o.steps for o in outs], np.int16),
            actions=(np.stack([o.actions[0] if o.actions is not None and len(o.actions) else np.zeros(self.action_dim, np.float32)
                               for o in outs]) if any(o.actions is not None for o in outs) else None),
            step_s=max(o.step_s for o in outs),
            reset_s=sum(o.reset_s for o in outs),
            reset_seeds=np.array([o.obs.reset_seed for o in outs], np.int64),
            instructions=[o.obs.instruction for o in outs],
        )

    @staticmethod
    def first(obs: list[Obs]) -> list[StepOut]:
        return [StepOut(o, 0.0, False, False, False, False, 0.0, 0.0, 0.0, steps=0) for o in obs]


class LocalVecEnv(_GroupBase):
    """Envs stepped inside the Simulator rank (cheap envs). Emulated latency is honoured
    without sleeping: the result becomes ready when its delay has passed."""

    def __init__(self, cfg, env_ids, seed, auto_reset, encode):
        super().__init__(cfg, env_ids, seed, auto_reset, encode)
        self.eps = [Episode(cfg, i, seed, auto_reset) for i in self.env_ids]
        self._out: list[StepOut] | None = None
        self._ready_at = 0.0

    def start_reset(self, seed: int | None = None) -> None:
        self._out = self.first([e.reset(seed) for e in self.eps])
        self._ready_at = time.monotonic()

    def start_step(self, actions: np.ndarray | None) -> None:
        """actions [n, K, A], or None: every env's scripted expert takes one step."""
        chunks = [None] * len(self.eps) if actions is None else actions
        self._out = [e.step(a) for e, a in zip(self.eps, chunks)]
        self._ready_at = time.monotonic() + max(o.delay_s for o in self._out)

    def ready(self) -> bool:
        return self._out is not None and time.monotonic() >= self._ready_at

    def deadline(self) -> float | None:
        """When the pending result becomes ready (monotonic), if one is pending."""
        return self._ready_at if self._out is not None else None

    def wake_fds(self) -> tuple:
        return ()   # nothing arrives from outside: the result is due at `deadline()`

    def result(self) -> GroupStep:
        out, self._out = self._out, None
        return self.gather(out)

    def close(self) -> None:
        for e in self.eps:
            e.close()


class EnvStartError(RuntimeError):
    """An env's child process keeps dying (or hanging) before it ever answers."""


def _worker(conn, cfg, env_id: int, seed: int, auto_reset: bool, episode: int) -> None:
    """Child process: host one env and answer ('reset',) / ('step', action) / ('close',).

    Slurm signals every process of a job step with USR2 before the time limit (the rank checkpoints
    and requeues on it), then TERM when it ends or requeues the step (the ranks let submitit
    bypass it until KILL), and `kill -USR1` asks a rank for its stacks: a child killed by any of
    them would take its episode with it, and its Simulator would restart it while the job winds
    down, so the child ignores all three. It ends when its Simulator closes it, kills it, or dies
    (end of file on its pipe)."""
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    notices.keep_out_of_console(cfg.run_dir, f"env{env_id:04d}", cfg.runtime.verbose)   # before the simulator's import
    notices.prints_to_log(cfg.run_dir, f"env{env_id:04d}", cfg.runtime.verbose)
    ep = Episode(cfg, env_id, seed, auto_reset)
    ep.episode = episode
    while True:
        try:
            cmd = conn.recv()
        except (EOFError, OSError):   # the Simulator is gone (killed, or its job ended): nobody to answer
            ep.close()
            return
        if cmd[0] == "close":
            ep.close()
            conn.close()
            return
        if cmd[0] == "reset":
            conn.send(ep.reset(cmd[1]))
        else:
            out = ep.step(cmd[1])
            conn.send(out)


class ProcessVecEnv(_GroupBase):
    """One spawned child process per env; a hung or dead child is killed and restarted."""

    def __init__(self, cfg, env_ids, seed, auto_reset, encode):
        super().__init__(cfg, env_ids, seed, auto_reset, encode)
        self.ctx = mp.get_context("spawn")
        self.procs: list = [None] * len(self.env_ids)
        self.conns: list = [None] * len(self.env_ids)
        self.restarts = [0] * len(self.env_ids)
        self.answered = [False] * len(self.env_ids)        # the current child has sent a result
        self.spawned_at = [0.0] * len(self.env_ids)        # when the current child was started
        self.failed_starts = [0] * len(self.env_ids)       # consecutive children that never answered
        self.reset_seed: int | None = None                 # the seed of the group reset in progress
        self.restart_seed: list[int | None] = [None] * len(self.env_ids)
        self._pending: dict[int, tuple[str, float]] = {}   # env index -> (kind, deadline)
        self._out: list[StepOut | None] = [None] * len(self.env_ids)
        for k in range(len(self.env_ids)):
            self._spawn(k)

    def _spawn(self, k: int) -> None:
        # A restarted env continues with fresh episode seeds instead of replaying old ones.
        args = (self.env_ids[k], self.seed, self.auto_reset, 1000 * self.restarts[k])
        if self.cfg.env.python:
            self.procs[k], self.conns[k] = start_foreign(self.cfg, *args)
        else:
            parent, child = self.ctx.Pipe()
            p = self.ctx.Process(target=_worker, args=(child, self.cfg, *args), daemon=True, name=f"env{self.env_ids[k]}")
            p.start()
            child.close()
            self.procs[k], self.conns[k] = p, parent
        self.answered[k] = False
        self.spawned_at[k] = time.monotonic()

    def _kill(self, k: int) -> None:
        p = self.procs[k]
        if p is not None and p.is_alive():
            p.kill()
        if p is not None:
            p.join(timeout=5)
        self.conns[k].close()

    def start_reset(self, seed: int | None = None) -> None:
        deadline = time.monotonic() + self.cfg.env.reset_timeout
        self.reset_seed = seed
        for k in range(len(self.conns)):
            self._send(k, ("reset", seed), "reset", deadline)

    def start_step(self, actions: np.ndarray | None) -> None:
        """actions [n, K, A], or None: every env's scripted expert takes one step."""
        deadline = time.monotonic() + self.cfg.env.step_timeout
        for k in range(len(self.conns)):
            self._send(k, ("step", None if actions is None else np.asarray(actions[k], np.float32)), "step", deadline)

    def _send(self, k: int, cmd: tuple, kind: str, deadline: float) -> None:
        """A child that died while its group waited (for an action) is found here: `ready` restarts it.
        A child that has not answered yet is still starting: it has until env.start_timeout."""
        if not self.answered[k]:
            deadline = max(deadline, self.spawned_at[k] + self.cfg.env.start_timeout)
        try:
            self.conns[k].send(cmd)
        except OSError:
            deadline = 0.0
        self._pending[k] = (kind, deadline)

    def ready(self) -> bool:
        now = time.monotonic()
        for k, (kind, deadline) in list(self._pending.items()):
            died = deadline == 0.0   # _send found its pipe broken
            try:
                has = self.conns[k].poll()
                msg = self.conns[k].recv() if has else None
            except (EOFError, OSError):
                has, msg = False, None
                deadline, died = 0.0, True  # the child died: restart now
            if has:
                self.answered[k] = True
                self.failed_starts[k] = 0
                self._out[k] = self.first([msg])[0] if kind in ("reset", "restart") and isinstance(msg, Obs) else msg
                if kind == "restart":
                    o = self._out[k]
                    self._out[k] = StepOut(o.obs, 0.0, False, True, False, True, 0.0, 0.0, 0.0, steps=0)
                del self._pending[k]
            elif now > deadline:
                self._restart(k, kind, died)
        return not self._pending

    def deadline(self) -> float | None:
        return None  # results arrive from the children; nothing is due at a known time

    def wake_fds(self) -> tuple:
        """The pipes of the children whose result is pending: an idle Simulator waits on them."""
        return tuple(self.conns[k].fileno() for k in self._pending if self.conns[k] is not None and not self.conns[k].closed)

    def _restart(self, k: int, kind: str, died: bool) -> None:
        p = self.procs[k]
        if died:
            p.join(timeout=5)   # its pipe closed: let it finish exiting, for the exit code
        what = f"died (exit code {p.exitcode})" if died or not p.is_alive() else "timed out"
        if not self.answered[k]:
            self.failed_starts[k] += 1
        if self.failed_starts[k] > self.cfg.env.max_failed_starts:
            self._kill(k)
            e = self.cfg.env
            raise EnvStartError(
                f"env {self.env_ids[k]}: its child process {what} before answering, {self.failed_starts[k]} times in "
                f"a row (env.max_failed_starts={e.max_failed_starts}); env.name={e.name!r} env.task={e.task!r} "
                f"env.cameras={list(e.cameras)}: the child's traceback is above (an unknown task or camera, a "
                "simulator that is not installed, no headless GL: MUJOCO_GL=egl needs libegl1)")
        print(f"[env {self.env_ids[k]}] child process {what} during {kind}; restarting it (episode truncated)", flush=True)
        self._kill(k)
        self.restarts[k] += 1
        self._spawn(k)
        # A child lost during a group reset resets from that reset's seed (a shared GRPO seed: the
        # group must stay one initial state); one lost mid-episode starts a fresh episode of its own.
        self.restart_seed[k] = self.reset_seed if kind == "reset" else self.restart_seed[k] if kind == "restart" else None
        self._send(k, ("reset", self.restart_seed[k]), "restart", time.monotonic() + self.cfg.env.reset_timeout)

    def result(self) -> GroupStep:
        out, self._out = self._out, [None] * len(self.env_ids)
        return self.gather(out)

    def close(self) -> None:
        """Idle children are asked to close (5 s, then killed). A child still at work on a request
        is killed at once: its answer would be discarded, and a reset building another task's
        scene when the run stops held the rank for the whole wait (10 s of every multi-task
        LIBERO run's end)."""
        for k, c in enumerate(self.conns):
            if k in self._pending:
                continue
            try:
                c.send(("close",))
            except OSError:
                pass
        for k, p in enumerate(self.procs):
            if k in self._pending and p.is_alive():
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


class ForeignProcess:
    """An env child under another interpreter (`env.python`), seen through the part of
    multiprocessing.Process that ProcessVecEnv uses."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()   # -N when killed by signal N, as multiprocessing says it

    def kill(self) -> None:
        self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def foreign_env() -> dict[str, str]:
    """The environment of a process under env.python: ours, with only our source tree on
    PYTHONPATH (the interpreter's own packages, not ours, supply numpy and the simulator)."""
    return {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}


def start_foreign(cfg, env_id: int, seed: int, auto_reset: bool, episode: int) -> tuple[ForeignProcess, WireConnection]:
    """`env.python -m rlvla3.envs.worker FD`, with only our source tree on its PYTHONPATH (the
    interpreter's own packages, not ours, must supply numpy and the simulator)."""
    ours, theirs = socket.socketpair()
    popen = subprocess.Popen([interpreter(cfg), "-m", "rlvla3.envs.worker", str(theirs.fileno())],
                             pass_fds=(theirs.fileno(),), env=foreign_env())
    theirs.close()
    conn = WireConnection(Connection(ours.detach()))
    conn.send({"cfg": config_tree(cfg), "env_id": env_id, "seed": seed, "auto_reset": auto_reset, "episode": episode})
    return ForeignProcess(popen), conn


def check_env(cfg, timeout: float = 300.0) -> None:
    """The env's interpreter (env.python, else this one) starts, imports numpy, our worker and the
    env's simulator, and the simulator accepts the task, suite, robot and cameras the config names
    (`envs/choices.py`, read from its own packages). Raises ValueError naming the bad value and
    the valid ones (the launcher turns it into a ConfigError before any rank starts)."""
    if cfg.env.name not in CHECKS and not cfg.env.python:
        return
    python = interpreter(cfg) or sys.executable
    env = config_tree(cfg)["env"]
    key = json.dumps([python, *(env[k] for k in CHOSEN)])
    if key in _ACCEPTED:   # one process launching many runs (a sweep, the tests) asks once
        return
    try:
        p = subprocess.run([python, "-m", "rlvla3.envs.choices", json.dumps(env)], cwd=SOURCE_ROOT,
                           env=foreign_env() if cfg.env.python else None, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"env.python={cfg.env.python!r} does not run ({type(e).__name__}: {e})") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"env.python={cfg.env.python!r} cannot host env.name={cfg.env.name!r}: importing numpy, "
                         f"rlvla3.envs.worker and {SIM_MODULES.get(cfg.env.name)} failed: {last}")
    refused = json.loads(p.stdout.strip().splitlines()[-1])
    if refused:
        raise ValueError(f"env.name={cfg.env.name}: " + "; ".join(refused))
    _ACCEPTED.add(key)


CHOSEN = ("name", "task", "suite", "task_ids", "init_states", "robot", "cameras")
"""The env fields `check_env`'s answer depends on (envs/choices.py reads no other)."""
_ACCEPTED: set[str] = set()


def make_vec_env(cfg, env_ids: list[int], seed: int, *, auto_reset: bool, encode):
    """A group of envs: in-process (`envs.in_process`), else one spawned child process per env (a
    GL context per process, killable on a hang). `auto_reset`: an env whose episode ended resets
    at once; off (episodic runs), it waits for the group's next `start_reset`. `encode`: the
    policy's instruction -> tokens (policies.prompts.instruction_encoder; envs know no policy)."""
    cls = LocalVecEnv if in_process(cfg) else ProcessVecEnv
    return cls(cfg, env_ids, seed, auto_reset, encode)
