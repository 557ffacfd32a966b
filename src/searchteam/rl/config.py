"""Every knob of RL training in one validated object (defaults, then YAML, then CLI flags). `estimator`
names are validated against the registry of `rl.advantages`, imported when a config is validated."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _registered_estimator(name: str) -> str:
    from searchteam.rl.advantages import get_adv_estimator  # imports torch: only when validating

    get_adv_estimator(name)  # unknown: ValueError naming the registered ones
    return name


Estimator = Annotated[str, AfterValidator(_registered_estimator)]  # a name in rl.advantages' registry
Schedule = Literal["constant", "linear", "cosine"]
LossAgg = Literal["token_mean", "seq_mean"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k3"]

Critic = Literal["head", "separate"]

LOG_NAME = "train_log.jsonl"  # one JSON record per training step, in the run directory
ROLLOUTS_NAME = "rollouts.jsonl"  # one JSON record per rewarded episode (traces without prompts)
CHECKPOINTS = "checkpoints"  # checkpoints/step-NNNNNN, in the run directory
WARM_START = "warm_start"  # warm_start/round-NN (policy after each round), kept.jsonl, log.jsonl


class RoleEstimator(BaseModel):
    """The advantage estimator of one role and its options; unset options take the run's values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    estimator: Estimator = Field(description="the role's advantage estimator (as train.estimator)")
    gamma: float | None = Field(None, ge=0.0, le=1.0, description="GAE discount; unset: train.gamma")
    lam: float | None = Field(None, ge=0.0, le=1.0, description="GAE λ; unset: train.lam")
    adv_scale_by_std: bool | None = Field(None, description="unset: train.adv_scale_by_std")
    whiten_advantages: bool | None = Field(None, description="unset: train.whiten_advantages")


class WarmStartConfig(BaseModel):
    """Rejection-sampling fine-tuning (expert iteration) before RL, for roles that cannot yet earn reward:
    each round samples `samples_per_question` rollouts of `questions_per_round` train questions at
    `temperature` (by the policy itself, or by `teacher`), keeps the episodes whose final answer scores
    F1 ≥ `min_f1` and whose policy turns all parsed (or, with `keep_by: role_reward`, each role's turns by
    that role's reward), and fine-tunes every policy turn kept so far by likelihood (mean token NLL),
    `epochs` passes, with its own AdamW."""

    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(1, ge=1, description="collect → fine-tune rounds")
    questions_per_round: int = Field(
        32, ge=1, description="train questions per round (drawn apart from RL's); a multiple of the processes"
    )
    samples_per_question: int = Field(4, ge=1, description="rollouts per question")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="sampling temperature of its rollouts")
    min_f1: float = Field(0.5, ge=0.0, le=1.0, description="keep episodes whose answer F1 reaches this")
    keep_by: Literal["answer", "role_reward"] = Field(
        "answer",
        description="answer: keep whole episodes by their answer's F1 (min_f1); role_reward: keep each "
        "role's turns on their own when the method's reward gives that role a return (the sum of its "
        "turns' rewards) of at least min_role_reward, e.g. DAC's searcher for sufficient evidence even "
        "when the generator then answered wrong (role-specific credit, dac.txt §3.2)",
    )
    min_role_reward: float = Field(1.0, description="keep_by role_reward: a role's return to keep its turns")
    require_parsed: bool = Field(True, description="keep only episodes whose policy turns all parsed")
    min_support_recall: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="also keep only episodes whose retrieved passages cover this share of the question's "
        "supporting_titles (a searcher's recall; questions without them are never kept); unset: no check",
    )
    min_titles_added: int | None = Field(
        None,
        ge=1,
        description="also keep only episodes whose later searches returned at least this many supporting "
        "titles that the first search did not (a searcher's second hop; questions without supporting_titles "
        "are never kept); unset: no check",
    )
    teacher: str | None = Field(
        None, description="model whose traces are kept (e.g. qwen2.5-coder-0.5b); default: the policy"
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="team options for the warm start's rollouts, over the run's (e.g. DAC's "
        "hard_positives: false, so no answer on distractor-laden evidence is imitated whether right or not)",
    )
    epochs: int = Field(2, ge=1, description="passes over the kept turns per round")
    lr: float = Field(1e-4, gt=0.0, description="learning rate of its own AdamW (RL starts from a fresh one)")
    micro_batch_size: int = Field(4, ge=1, description="samples per forward pass, at most")
    mini_batch_size: int = Field(
        16, ge=1, description="samples per optimizer step over all processes, at most (see TrainConfig)"
    )


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # advantages
    estimator: Estimator = Field("grpo", description="gae (PPO + critic), grpo, or role_grpo (DECOR Eq. 6)")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount over turns")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE λ")
    adv_eps: float = Field(1e-6, gt=0.0, description="ε added to the group std GRPO divides by")
    adv_scale_by_std: bool = Field(True, description="GRPO: divide by the group std (False: Dr. GRPO)")
    whiten_advantages: bool = Field(False, description="GAE: normalize advantages over the batch")
    role_estimators: dict[str, RoleEstimator] = Field(
        default_factory=dict,
        description="per-role estimator and options (DAC: searcher gae, generator grpo); other roles use "
        "`estimator`. A role with its own estimator computes its advantages over its own turns only",
    )
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal")
    resample_rounds: int = Field(
        0,
        ge=0,
        description="DAPO dynamic sampling: up to this many extra rollout rounds per step, on fresh "
        "questions, until the batch holds as many informative groups as the first round had groups",
    )
    # policy loss
    ratio_level: RatioLevel = Field("token", description="token (PPO/GRPO) or sequence (GSPO, DECOR Eq. 5)")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ε_low: ratio floor 1 − ε_low")
    clip_high: float = Field(0.2, ge=0.0, description="ε_high: ratio ceiling 1 + ε_high (clip-higher)")
    loss_agg: LossAgg = Field(
        "token_mean",
        description="token_mean: every trained token weighs the same (GRPO, DAPO); seq_mean: the mean of "
        "each sample's token mean, every sample once (GSPO)",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="β of the KL penalty to the frozen initial policy")
    kl_estimator: KLEstimator = Field(
        "k3", description="per-token KL estimate: k1 = log π/π_ref, k3 = π_ref/π − log(π_ref/π) − 1 (≥ 0)"
    )
    old_logprobs: Literal["recompute", "rollout"] = Field(
        "recompute",
        description="π_old: recompute with the policy before updating (exact), or reuse the sampling "
        "logprobs the backend recorded (saves a forward pass; falls back to recompute when any is missing)",
    )
    rollout_is_cap: float | None = Field(
        None,
        gt=0.0,
        description="truncated importance sampling: weight each token's surrogate by min(π_old/π_rollout, "
        "cap), where the rollout engine gave the sampled tokens' logprobs (backend: openai); unset: off",
    )
    sft_coef: float = Field(
        0.0,
        ge=0.0,
        description="β_SFT of DAC Eq. 8: weight of an auxiliary SFT loss on turns whose reward scheme "
        "recorded a pseudo-target (`turn.sft_target`); 0 = off",
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="entropy bonus: loss = pg_loss − c·entropy, aggregated like the policy loss"
    )
    # critic (estimator=gae)
    critic: Critic = Field(
        "head",
        description="head: a value head on the policy's last hidden state (its loss also trains the "
        "shared trunk); separate: a value model of its own (M-ASK's V_φ): its own LoRA adapter (or, with "
        "full_ft, its own copy of the model) plus the head",
    )
    value_coef: float = Field(0.5, ge=0.0, description="weight of the critic's value loss")
    value_clip: float | None = Field(
        0.2, gt=0.0, description="ε of the clipped value loss (V_old ± ε, PPO2-style); unset: unclipped"
    )
    value_lr: float | None = Field(None, gt=0.0, description="critic head learning rate (default: lr)")
    # model and adapters
    full_ft: bool = Field(False, description="train every weight instead of LoRA adapters")
    lora_per_role: bool = Field(False, description="one LoRA adapter per role on one backbone (DAC)")
    roles: list[str] = Field(default_factory=list, description="roles to train; empty = every policy role")
    lora_r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, ge=1, description="LoRA α: the adapter's update is scaled by α / r")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the LoRA adapters' input")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the modules that get LoRA adapters",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, slower updates"
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="autocast of the update (accelerate's mixed_precision); no: the weights' dtype"
    )
    # optimization
    lr: float = Field(1e-5, gt=0.0, description="learning rate (AdamW)")
    role_lr: dict[str, float] = Field(default_factory=dict, description="per-role learning rate (LoRA)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW's weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's β1, β2")
    max_grad_norm: float = Field(
        1.0,
        gt=0.0,
        description="clip each parameter group's gradient norm (each adapter, the critic) to this",
    )
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    schedule: Schedule = Field(
        "constant",
        description="learning rate after the warm-up: constant, or linear or cosine decay to the end",
    )
    min_lr_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="linear or cosine decay: the last step's learning rate, as a share of lr",
    )
    ppo_epochs: int = Field(1, ge=1, description="passes over each step's batch")
    mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="samples per optimizer step over all processes, at most: a batch of N samples takes "
        "ceil(N / mini_batch_size) optimizer steps per epoch, whatever the number of processes; unset: "
        "the whole batch, one optimizer step per epoch",
    )
    micro_batch_size: int = Field(4, ge=1, description="samples per forward pass, at most")
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="padded tokens per forward pass (samples × longest sample), at most: micro-batches "
        "of short samples hold more of them; a longer sample goes alone; unset: no token budget. With "
        "share_prefixes: the distinct tokens of a packed row",
    )
    share_prefixes: bool = Field(
        False,
        description="forward each micro-batch as one packed row in which a token prefix shared by several "
        "samples (the system prompt, the question, an earlier turn) is computed once: the same loss and "
        "gradients for fewer tokens. Micro-batches then take samples in token order and are bounded by "
        "distinct tokens: micro_batch_tokens, or micro_batch_size × the mean sample length",
    )
    merge_continuations: bool = Field(False, description="one trajectory sample per continued message")
    # run
    steps: int = Field(
        100,
        ge=0,
        description="RL steps in all, one rollout batch each (a resumed run goes on up to this total); 0: "
        "the warm start only",
    )
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(0, ge=0, description="keep the newest N checkpoints (0: all)")
    save_rollouts: bool = Field(True, description="append every step's rewarded episodes to rollouts.jsonl")
    save_rollout_prompts: bool = Field(
        False,
        description="rollouts.jsonl keeps whole episodes: each turn's prompt messages, continuation, token "
        "ids and logprobs, and each search's passages (about 20 KB per QAgent episode), so `searchteam "
        "export` can write the rollouts' prompts and exact tokens",
    )
    dist_timeout_s: int = Field(
        1800,
        ge=10,
        description="several processes: how long a collective waits for the slowest rank (its rollouts) "
        "before the run fails instead of hanging",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.full_ft and self.lora_per_role:
            raise ValueError("full_ft and lora_per_role exclude each other: per-role training needs adapters")
        if self.role_lr and not self.lora_per_role:
            raise ValueError("role_lr needs lora_per_role: a shared model has one learning rate")
        if self.lora_per_role and not self.roles:
            raise ValueError("lora_per_role needs the list of roles (one adapter each)")
        if self.roles and set(self.role_estimators) - set(self.roles):
            extra = sorted(set(self.role_estimators) - set(self.roles))
            raise ValueError(
                f"role_estimators names roles that are not trained: {extra} (roles: {self.roles})"
            )
        return self

    def estimator_of(self, role: str) -> RoleEstimator:
        """The estimator and options that compute `role`'s advantages, every option resolved."""
        own = self.role_estimators.get(role)
        return RoleEstimator(
            estimator=own.estimator if own else self.estimator,
            gamma=self.gamma if own is None or own.gamma is None else own.gamma,
            lam=self.lam if own is None or own.lam is None else own.lam,
            adv_scale_by_std=self.adv_scale_by_std
            if own is None or own.adv_scale_by_std is None
            else own.adv_scale_by_std,
            whiten_advantages=self.whiten_advantages
            if own is None or own.whiten_advantages is None
            else own.whiten_advantages,
        )

    @property
    def uses_critic(self) -> bool:
        """Whether any role's advantages come from GAE, which needs value estimates."""
        return self.estimator == "gae" or any(r.estimator == "gae" for r in self.role_estimators.values())

    @property
    def sums_returns(self) -> bool:
        """Whether some trained turn's credit sums the rewards of later turns (GAE with γ > 0, or samples
        that merge a chain of continued turns): rewards must then be placed as increments, not repeated
        on every turn."""
        estimators = [self.estimator_of(r) for r in self.role_estimators] + [self.estimator_of("")]
        summing = any(e.estimator == "gae" and (e.gamma or 0) > 0 for e in estimators)
        return summing or self.merge_continuations
