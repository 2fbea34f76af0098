"""`rlkube orchestrator`: environments, rollouts, advantages, batches for the trainer."""

import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlkube.config.base import Config
from rlkube.config.renames import RenamedKeyWarning, rename_keys
from rlkube.scopes import MEMBER_NAME


class EnvConfig(Config):
    UNSUPPORTED = {
        "env": "prime-rl's verifiers v1 env-server block (taskset, agent harness): rlkube names an environment "
               "by `id` (a built-in, an installed environment module or a verifiers taskset id) with `args` for "
               "its loader, and picks how rollouts run with `rollout_path`",
    }

    id: str = "reverse_text"
    """A `verifiers` environment: a built-in rlkube env (`reverse_text`) or an installed
    environment module (what `verifiers.load_environment` takes)."""

    args: dict[str, Any] = {}
    """Keyword arguments for the environment's `load_environment`."""

    name: str | None = None
    """Name in metrics; the id when unset."""

    ratio: float = Field(default=1.0, gt=0)
    """Relative share of this environment's tasks in each training batch."""

    rollout_path: Literal["auto", "lean", "verifiers"] = "auto"
    """How rollouts reach the engine. `lean`: model calls go from the in-process harness to
    verifiers' interception handler by function call, not over local HTTP (same traces, far
    less CPU); `verifiers`: verifiers' full path (an interception server, for harnesses that
    run programs, sandboxes or tools); `auto`: lean where every harness runs in-process and
    no tool servers are used."""


HELD_OUT = {"split": "test"}
"""The args an eval environment gets unless it says otherwise: its held-out split."""


def on_held_out_split(env: Any) -> Any:
    """An eval environment's input with `args.split = "test"` added where its args name no split:
    `--env.id X` (or `[[orchestrator.eval.envs]] id = "X"`) scores X's held-out split, not the
    train split its `load_environment` defaults to; `args.split = "train"` scores that one."""
    if not isinstance(env, dict):
        return env
    args = env.get("args", {})
    if not isinstance(args, dict) or "split" in args:
        return env
    return {**env, "args": HELD_OUT | args}


class SamplingConfig(Config):
    """How inference samples. Training sampling must draw from the full tempered distribution
    (temperature > 0, top_p = 1): the trainer recomputes each token's log-prob as
    `log_softmax(logits / temperature)`, and a truncated distribution would make vLLM's
    log-probs disagree with it."""

    RENAMED = {"max_completion_tokens": "max_tokens"}
    SECTION = "sampling"

    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (0 is greedy: eval only)."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling (below 1: eval only)."""

    max_tokens: int = Field(default=256, ge=1)
    """Maximum completion tokens per turn."""

    @model_validator(mode="before")
    @classmethod
    def _no_truncated_sampling(cls, data: Any) -> Any:
        for name in ("top_k", "min_p"):
            if isinstance(data, dict) and name in data:
                raise ValueError(
                    f"{name}: not supported: rlkube samples the full tempered distribution, whose "
                    "log-probs the trainer recomputes; truncated sampling would make them disagree"
                )
        return data


class AdvantageConfig(Config):
    std_normalize: bool = False
    """Divide by the group's reward std (GRPO); off by default (Dr. GRPO)."""

    length_penalty: float = Field(default=0.0, ge=0)
    """Subtract `length_penalty * completion_tokens / max_tokens` from the reward before the baseline."""

    custom: str | None = None
    """Import path `package.module:function` of a custom advantage function."""


class DifficultyConfig(Config):
    """Tasks the policy always solves (easy) or never solves (hard) teach GRPO nothing: their
    groups have no reward spread. A task whose newest group's mean reward is at least
    `easy_threshold` is easy, at most `hard_threshold` hard; when its turn comes in the epoch an
    easy task runs with probability `easy_keep` and a hard one with `hard_keep`, and is skipped
    otherwise. A task that runs again gets the label of its new group, so one that became
    solvable (or was forgotten) comes back."""

    easy_threshold: float = 1.0
    hard_threshold: float = 0.0
    easy_keep: float = Field(default=0.1, ge=0, le=1)
    """Probability that an easy task runs when its turn comes (0: never again, unless every
    task is skipped in a whole pass)."""
    hard_keep: float = Field(default=0.5, ge=0, le=1)
    """Probability that a hard task runs when its turn comes."""

    @model_validator(mode="after")
    def _hard_below_easy(self):
        if self.hard_threshold >= self.easy_threshold:
            raise ValueError(f"hard_threshold ({self.hard_threshold}) must be below easy_threshold ({self.easy_threshold})")
        return self


class EvalConfig(Config):
    RENAMED = {"env": "envs", "group_size": "rollouts_per_example"}
    SECTION = "orchestrator.eval"
    envs: list[EnvConfig] = Field(default=[EnvConfig(args=HELD_OUT)], min_length=1)
    """Environments to evaluate on (at least one: leave `eval` out for none): each on its held-out split (`args.split = "test"`) unless its
    `args` name a `split`."""

    interval: int = Field(default=100, ge=1)
    """Evaluate every N steps (and at step 0 and the last step)."""

    num_examples: int | None = Field(default=None, ge=1)
    """Examples per environment; all when unset."""

    rollouts_per_example: int = Field(default=1, ge=1)
    """k for avg@k and pass@k."""

    pass_threshold: float = Field(default=1.0, ge=0)
    """A rollout passes (for pass@k) when its reward is at least this."""

    sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    """Eval sampling (greedy by default)."""

    @model_validator(mode="before")
    @classmethod
    def _envs_on_held_out_split(cls, data: Any) -> Any:
        data = rename_keys(data, cls.RENAMED, cls.SECTION)  # `env` entries too (Config's renaming runs after this)
        if isinstance(data, dict) and isinstance(data.get("envs"), list):
            data = {**data, "envs": [on_held_out_split(env) for env in data["envs"]]}
        return data


class ClientConfig(Config):
    """How the orchestrator talks to inference."""

    base_urls: list[str] = ["http://127.0.0.1:8000"]
    """One base URL per inference replica."""

    base_urls_file: str | None = None
    """A file listing the inference replicas' base URLs, one a line, read again every
    `resync_interval_s`: the replicas it lists replace `base_urls` while the process runs (a
    new one is brought to the current policy before it gets a request; one no longer listed
    gets no new requests and its rollouts in flight finish or are re-issued). The operator
    points it at its ConfigMap, so `kubectl scale rlrun` resizes the pool without a restart.
    Unset, or while the file is missing or empty: `base_urls`."""

    timeout_s: float = Field(default=600, gt=0)
    """Per-request timeout."""

    max_concurrent: int = Field(default=256, ge=1)
    """Requests in flight across all replicas (backpressure)."""

    lora_adapter: str | None = None
    """The model name inference serves a LoRA run's policy under once one is loaded (vLLM's
    LoRA support: `inference.max_lora_rank`); requests name it from the first policy update on,
    and the base model before it. `rlkube rl` sets it when `trainer.lora.serving` is `adapter`.
    Unset: every request names the model (adapters are merged into its weights)."""

    resync_interval_s: float = Field(default=2.0, gt=0)
    """How often the orchestrator checks that every replica serves the current policy, and
    brings one that restarted (paused, weight version "default") back to it before it
    generates anything."""


class ServedModelClient(Config):
    """Which credential the calls to a teacher or a judge carry."""

    served_by_run: bool = False
    """Whether `base_urls` are servers the run starts itself (`rlkube rl`'s `[teacher]` and
    `[judge]`, an RLRun's `spec.teacher` and `spec.judge`): only those are sent the run's
    generate credential. Set by `rlkube rl` and the operator, which overrides a user's value."""

    api_key_env: str | None = None
    """For servers outside the run (a hosted API): the environment variable holding the key
    sent as `Authorization: Bearer <key>` (on a cluster, an `env` entry of the orchestrator's
    and env workers' pods from a Secret of yours). It is taken out of the environment before
    any environment runs, as the run's credentials are. Unset, a server outside the run is
    sent no credential."""

    @field_validator("api_key_env")
    @classmethod
    def _not_the_runs(cls, name: str | None) -> str | None:
        if name is not None and (not name or name.startswith("RLKUBE_")):
            raise ValueError(f"{name!r}: name a variable of your own; the run's credentials (RLKUBE_*) are sent "
                             "only to the run's own servers")
        return name


class TeacherConfig(ServedModelClient):
    """The teacher of on-policy distillation: an inference server (`rlkube inference`, not
    paused) whose model scores the student's sampled tokens. It is never updated."""

    model: str
    """The model name the teacher server serves (the requests' `model`)."""

    base_urls: list[str] = Field(default=["http://127.0.0.1:8001"], min_length=1)
    """One base URL per teacher replica; a task's samples go to one replica (prefix cache)."""

    timeout_s: float = Field(default=600, gt=0)
    """Per-request timeout."""

    max_concurrent: int = Field(default=64, ge=1)
    """Scoring requests (one per sample) in flight across all teacher replicas."""


class JudgeConfig(ServedModelClient):
    """The judge of environments scored by verifiers' judges (`verifiers.v1.judges`: reference,
    rubric): an inference server (`rlkube inference`, not paused) that the processes running
    rollouts reach through a loopback endpoint of their own (`rlkube.orchestrator.judge`), which
    adds the run's token, meters the calls and waits out a judge that is down. Every judge an
    environment plugs (`taskset.task.judges`) is pointed at it."""

    model: str
    """The model name the judge server serves (the requests' `model`)."""

    base_urls: list[str] = Field(default=["http://127.0.0.1:8200"], min_length=1)
    """One base URL per judge replica; a request goes to the replica with the fewest in flight."""

    sampling: dict[str, Any] = {}
    """Sampling of every judge call: verifiers' `SamplingConfig` keys (`temperature`,
    `max_tokens`, `top_p`), and any other key (vLLM's `structured_outputs`, for one) goes in the
    request body as it is. The keys set here override the environment's own judge sampling."""

    timeout_s: float = Field(default=600, gt=0)
    """Per-request timeout."""

    max_concurrent: int = Field(default=64, ge=1)
    """Judge requests in flight across all judge replicas; more wait their turn."""

    wait_s: float = Field(default=60, gt=0)
    """How long a judge call waits for an unreachable judge (refused, reset, or answering 502,
    503 or 504), retrying with backoff from 0.5 s doubling to 5 s. Past it, the call fails and
    its rollout is re-issued (`orchestrator.client`'s re-issue, as for a lost inference
    replica): a rollout is never scored without its judge."""


class RolloutServerConfig(Config):
    """The gRPC endpoint that serves batches to the trainer."""

    host: str = "127.0.0.1"
    """Address: the orchestrator binds it, the trainer connects to it."""

    port: int = Field(default=50051, ge=1, le=65535)
    """gRPC port."""

    timeout_s: float = Field(default=3600, gt=0)
    """How long the trainer waits for one batch before giving up."""


class PoolMemberConfig(Config):
    """The `[pool]` section of a member run's orchestrator: it trains on a pool's trainer
    (`rlkube pool-trainer`) and generates on the pool's inference, with its own LoRA adapter.
    Unset: a solo run, with a trainer and inference of its own."""

    member: str
    """The member's name: its directory under the pool's `members/` and its adapter's model name
    on the pool's inference (lower-case DNS-1123: `<namespace>.<run>` on a cluster). Every
    request names it, step 0 and evals included; `client.lora_adapter` is set to it."""

    trainer: str
    """`host:port` of the pool trainer's Pool service (`pool.port` of its `pool.toml`), where the
    member attaches itself at start, and again whenever the pool trainer lost it (a restart)."""

    trainer_config: Path
    """The member's own trainer config (a `TrainerConfig` TOML file: what `rlkube rl` writes as
    `trainer.toml`), sent with Attach: its optimizer, schedule, loss, `lora` (the pool's shape),
    seed, checkpoints. Its `max_steps` must be this orchestrator's."""

    weight: float = Field(default=1.0, gt=0)
    """The member's share weight in the pool trainer's fair share of trained tokens."""

    address: str | None = None
    """`host:port` the pool trainer dials for this member's batches (on a cluster, the member's
    orchestrator Service); `rollouts.host:rollouts.port` when unset."""

    attach_timeout_s: float = Field(default=600, gt=0)
    """How long attaching retries while the pool trainer's service does not answer (it starts,
    or restarts); past it the orchestrator fails. A refusal (the member does not fit) fails at once."""

    check_interval_s: float = Field(default=5.0, gt=0)
    """How often the orchestrator asks the pool trainer whether it is still a member (`Status`):
    one that restarted has lost its roster, and the member attaches again (resuming from its own
    checkpoint)."""

    @field_validator("member")
    @classmethod
    def _member_name(cls, member: str) -> str:
        if not MEMBER_NAME.fullmatch(member):
            raise ValueError(f"{member!r} is not a lower-case DNS-1123 name (a-z, 0-9, '-', '.'; at most 253)")
        return member

    @field_validator("trainer", "address")
    @classmethod
    def _host_port(cls, address: str | None) -> str | None:
        if address is not None:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{address!r} is not host:port")
        return address


class OrchestratorSection(Config):
    """The `[orchestrator]` section of an RL config."""

    RENAMED = {"train.env": "envs", "train.sampling": "sampling", "env": "envs", "rollouts_per_example": "group_size"}
    SECTION = "orchestrator"
    UNSUPPORTED = {
        "renderer": "rlkube renders prompts with the model's own chat template (vLLM's, through verifiers), "
                    "not prime-rl's client-side renderers; leave it out",
        "token_batch_size": "rlkube's batch is a number of rollouts (`batch_size`), not of tokens",
    }

    training_mode: Literal["rl"] = "rl"
    """prime-rl's key, with its one value rlkube's orchestrator has: it samples from the policy it
    trains (a `teacher`, when set, scores those rollouts: on-policy distillation is
    `trainer.loss.type = "opd"`). prime-rl's `opd` and `sft` are refused with where rlkube sets them."""

    batch_size: int = Field(default=128, ge=1)
    """Rollouts per training step (prime-rl's code counts its `batch_size` the same way); a
    multiple of `group_size`: `batch_size / group_size` tasks a step."""

    group_size: int = Field(default=8, ge=1)
    """Rollouts per task; advantages are computed within each group."""

    min_batch_samples: int = Field(default=1, ge=1)
    """The fewest samples a step trains on: a batch whose rollouts leave fewer to train on
    (errored, empty, or with `filter_zero_advantage` zero-advantage ones left out) takes more
    finished groups, beyond `batch_size`, until it has them. At most `batch_size`; a step
    never trains on zero samples. (Rollouts that lost their inference replica never count:
    they are re-issued.)"""

    seq_len: int = Field(default=2048, ge=8)
    """Tokens per packed training row."""

    share_prompts: bool = True
    """Pack the samples of a group after ONE copy of their common prompt, so the trainer
    computes it once per group instead of once per sample (same result, fewer tokens)."""

    max_off_policy_steps: int = Field(default=8, ge=0)
    """The staleness bound: a token sampled by a policy more than this many versions behind
    the trainer's when its batch is cut is not trained (`off_policy_drop` says what goes with
    it); dropped rollouts are replaced by new ones and counted (`off_policy/dropped_*`)."""

    off_policy_drop: Literal["rollout", "token"] = "rollout"
    """What the staleness bound drops. `rollout`: a rollout with any token past it, whole.
    `token`: only the tokens past it leave the loss, so a multi-turn rollout that continued
    across weight updates keeps its newer turns; a rollout with none left is dropped. A
    token's version is the engine's report of the policy that sampled it (the lean rollout
    path), else the rollout's oldest."""

    async_level: int = Field(default=1, ge=0)
    """How many steps inference may run ahead of the trainer: 1 is one-step overlap,
    0 is synchronous (generate, then train, then generate)."""

    over_provision: float = Field(default=2.0, ge=1.0)
    """Over-provisioning within the staleness bound: how many rollouts may be in flight or
    buffered, as a multiple of those the clock's batches need (`async_level + 1` batches
    ahead of the trainer). Only stragglers use the excess (a group still running after a
    batch's worth of rollouts launched after it finished): new groups start in their place,
    batches are cut from the first to finish, and a straggler that ends past
    `max_off_policy_steps` is dropped and counted (`off_policy/dropped_*`). 1 turns it off;
    sync mode (`async_level = 0`) ignores it.
    The default 2: at the tool service's default p99/p50 of 20, `async_level = 4` then steps
    at 1.4x the trainer's own step instead of 3x (`benchmarks/tail_scheduling.py`,
    docs/agentic.md); where nothing straggles (no tail) it changes nothing. Its cost is the
    stragglers the bound drops: inference spent on rollouts never trained."""

    envs: list[EnvConfig] = Field(default=[EnvConfig()], min_length=1)
    """Training environments, mixed by `ratio` (at least one)."""

    sampling: SamplingConfig = SamplingConfig()
    """Training sampling."""

    advantage: AdvantageConfig = AdvantageConfig()
    """Advantage computation."""

    difficulty: DifficultyConfig | None = None
    """Sample tasks the policy always or never solves less often; every task alike when unset."""

    filter_zero_advantage: bool = True
    """Drop samples whose advantage is zero (all-pass or all-fail groups teach nothing). Not
    with a `teacher`: its log-probs are a signal in every group."""

    teacher: TeacherConfig | None = None
    """On-policy distillation: the teacher that scores every sampled token (for the trainer's
    `loss.teacher_kl_coef` / `loss.type = "opd"`); none when unset."""

    judge: JudgeConfig | None = None
    """The judge that environments' verifiers judges call; they keep their own endpoints when
    unset."""

    eval: EvalConfig | None = None
    """Periodic evaluation; off unless given."""

    samples_interval: int | None = Field(default=None, ge=1)
    """Every this many steps, the step's batch as text: one row per sample (env, example,
    reward, advantage, policy steps, prompt and completion decoded with their special tokens) in
    `<output_dir>/samples/step_N.jsonl`, and a `samples` table in W&B; off when unset."""

    client: ClientConfig = ClientConfig()
    """Inference client."""

    http_port: int = Field(default=8080, ge=1, le=65535)
    """Port of `/metrics` (Prometheus) and `/status` (JSON for the operator)."""

    env_workers: int = Field(default=0, ge=0)
    """Processes that run the rollouts (`rlkube env-worker`), dialing the orchestrator's gRPC
    port, while the orchestrator keeps the clock, buffer, advantages and packing. 0 runs them
    in the orchestrator's own process (~200 single-turn rollouts per CPU-second on the lean
    path); add workers when rollouts need more CPU than one core (multi-turn and tool
    environments, many inference replicas). `rlkube rl` starts this many locally; on
    Kubernetes they are the run's env-worker Deployment."""

    env_worker_timeout_s: float = Field(default=1800, gt=0)
    """A group an env worker has held this long is sent to another worker too (the first
    answer is trained): a worker that hangs with its connection open cannot stall the run."""

    @model_validator(mode="before")
    @classmethod
    def _prime_rl_training_mode(cls, data: Any) -> Any:
        """prime-rl's `training_mode` values other than `rl`, refused with where rlkube sets them."""
        mode = data.get("training_mode", "rl") if isinstance(data, dict) else "rl"
        if mode == "opd":
            raise ValueError("training_mode 'opd': rlkube distills when the trainer's loss uses a teacher: set "
                             "trainer.loss.type = 'opd' and a [teacher] (or orchestrator.teacher), and leave "
                             "training_mode out")
        if mode == "sft":
            raise ValueError("training_mode 'sft' (a teacher generates the rollouts): not supported: rlkube's "
                             "orchestrator samples from the policy it trains; for SFT on a teacher's rollouts run "
                             "`rlkube eval --save-samples` against the teacher, then `rlkube sft` on the samples")
        return data

    @model_validator(mode="before")
    @classmethod
    def _batch_counts_rollouts(cls, data: Any) -> Any:
        """A config in prime-rl's names says what its `batch_size` trains: prime-rl's code counts
        it in rollouts as rlkube does, while its Training page calls it tasks per step."""
        if isinstance(data, dict) and "batch_size" in data and any(key.split(".")[0] in data for key in cls.RENAMED):
            group = data.get("group_size", data.get("rollouts_per_example", cls.model_fields["group_size"].default))
            if isinstance(data["batch_size"], int) and isinstance(group, int) and group > 0:
                warnings.warn(f"'orchestrator.batch_size' {data['batch_size']} counts rollouts, as prime-rl's code does: "
                              f"{data['batch_size'] / group:g} tasks x group_size {group} a step (for "
                              f"{data['batch_size']} tasks, set batch_size = {data['batch_size'] * group})",
                              RenamedKeyWarning, stacklevel=2)
        return data

    @property
    def drops_zero_advantage(self) -> bool:
        """`filter_zero_advantage`, except with a teacher (its KL term has a gradient there)."""
        return self.filter_zero_advantage and self.teacher is None

    @property
    def max_groups_in_flight(self) -> int:
        """Whole groups within `client.max_concurrent` rollouts (at least one)."""
        return max(1, -(-self.client.max_concurrent // self.group_size))

    @model_validator(mode="after")
    def _batch_is_whole_groups(self):
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})"
            )
        if self.min_batch_samples > self.batch_size:
            raise ValueError(
                f"min_batch_samples ({self.min_batch_samples}) must be at most batch_size ({self.batch_size})"
            )
        if self.group_size == 1 and self.advantage.custom is None:
            raise ValueError(
                "group_size 1 with the group-mean baseline makes every advantage zero (each rollout "
                "is its own group's mean): use group_size >= 2, or an advantage.custom function"
            )
        return self

    @field_validator("sampling")
    @classmethod
    def _honest_training_sampling(cls, sampling: SamplingConfig) -> SamplingConfig:
        if sampling.temperature <= 0:
            raise ValueError(
                f"temperature ({sampling.temperature:g}) must be > 0 for training: the trainer "
                "divides the logits by it to recompute the sampled tokens' log-probs (greedy "
                "decoding is for eval.sampling)"
            )
        if sampling.top_p < 1:
            raise ValueError(
                f"top_p ({sampling.top_p:g}) must be 1 for training: vLLM's log-probs would come "
                "from the truncated distribution and the trainer's from the full one, biasing the "
                "importance ratio (eval.sampling may use top_p)"
            )
        return sampling
