"""One DP training run: Poisson batches → DPEngine → optimizer, for exactly T steps.

:class:`Trainer` holds all state of a run (model, optimizer, sampler and noise generators, step)
and can save and restore it, so a resumed run ends exactly where an uninterrupted one would.
A run is trained by the one training loop, :func:`.epoch_loop.fit` (a run of one member here, of K in
a pack: :mod:`.pack_training`); :meth:`Trainer.fit` is that loop with a report of one run's metrics.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..privacy import calibrate_noise
from ..privacy.accountant import epsilon_curve
from ..privacy.schedule import accounted_steps, epoch_end_steps, num_steps, sample_rate
from ..registry import check_options
from ..timeline import mark
from .engine.batching import to_device
from ..schema import TrainConfig, names
from .data.catalog import DATASETS, load_dataset
from .registries import check_pairing, dataset_task
from .data.splits import DatasetSplits, take
from .data.splits import with_validation
from .engine.distributed import Baseline, Workers
from .engine.precision import Precision
from .engine.dp_engine import DPEngine
from .frozen_features import head_on_features
from .models.catalog import create_model, data_options, parameter_summary
from .engine.norm_stats import class_norm_statistics
from .engine.optimizers import make_optimizer
from ..schema.option_registries import DENOISERS, DIAGNOSTICS
from .engine.randomness import STREAMS, new_secret, stream
from .engine.sampling import PoissonSampler
from .epoch_loop import TrialDiverged, fit as fit_run
from .tasks import Generation, task_of


#: Called by :meth:`Trainer.fit` after every epoch with that epoch's metrics and the whole history.
Report = Callable[[dict, list], None]


def norm_metrics(norms: torch.Tensor, labels: torch.Tensor, clip_bound: float) -> dict:
    """An epoch's per-sample norm statistics (NOT private: computed from the private examples): the
    examples whose norm was not finite (they contributed nothing), the clipped fraction and the
    per-class norm distributions."""
    finite = torch.isfinite(norms)
    norms, labels = norms[finite], labels[finite]
    return {"nonfinite_examples": int((~finite).sum()),
            "clipped_fraction": float((norms > clip_bound).float().mean()) if len(norms) else 0.0,
            "nonprivate_gradnorms": class_norm_statistics(norms, labels, clip_bound, histogram=True)}


@dataclass(frozen=True)
class PrivacyPlan:
    """What the accountant fixes before training: q = B/N, T = ⌈E·N/B⌉ and σ."""

    sample_rate: float
    steps: int
    noise_multiplier: float

    @property
    def noise_sqrt_steps(self) -> float:
        return self.noise_multiplier * math.sqrt(self.steps)


def plan_privacy(cfg: TrainConfig, num_examples: int) -> PrivacyPlan:
    """q, T and σ for a config (σ = 0 for non-private runs; calibrated unless given)."""
    if cfg.batch_size > num_examples:
        raise UserError(f"batch_size must be <= the training set size {num_examples}; got {cfg.batch_size}")
    q = sample_rate(cfg.batch_size, num_examples)
    steps = num_steps(cfg.epochs, num_examples, cfg.batch_size)
    if not cfg.private:
        return PrivacyPlan(q, steps, 0.0)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise(cfg.epsilon, cfg.delta, q, steps, norm_estimator=cfg.norm_estimator,
                                sketch_k=cfg.sketch_k)
    return PrivacyPlan(q, steps, sigma)


def epoch_epsilons(cfg: TrainConfig, plan: PrivacyPlan) -> list[float]:
    """ε spent at the end of every epoch (0 before any step), from one accountant evaluation on the
    mesh of the whole run (:func:`~dptune.privacy.accountant.epsilon_curve`) instead of one per
    epoch: in a short trial the per-epoch evaluations cost about as much as the training."""
    counts = accounted_steps(cfg.epochs, plan.steps)
    curve = dict(zip(counts, epsilon_curve(plan.noise_multiplier, cfg.delta, plan.sample_rate, counts,
                                           norm_estimator=cfg.norm_estimator, sketch_k=cfg.sketch_k)))
    return [curve.get(t, 0.0) for t in epoch_end_steps(cfg.epochs, plan.steps)]


def check_workers(state: dict, workers: int) -> None:
    """Refuse a trainer state written on another number of workers: the shards and the order of the
    steps' sums depend on W, so it resumes with the same result only on as many as wrote it."""
    saved = state.get("workers", 1)
    if saved != workers:
        raise UserError(f"this checkpoint was written on {saved} worker(s); it resumes with the same result only "
                         f"on {saved} (the shards and step order depend on it), not on {workers}: set "
                         f"resources.workers to {saved}")


def engine_parts(cfg: TrainConfig) -> dict:
    """The engine's post-processor and diagnostics for ``cfg``, each built from the options it owns
    (``DENOISERS``, ``DIAGNOSTICS``)."""
    return {"denoise": None if cfg.denoise is None else DENOISERS.get(cfg.denoise).from_config(cfg),
            "diagnostics": [DIAGNOSTICS.get(d).from_config(cfg) for d in cfg.diagnostics]}


def part_metrics(parts: list, steps: dict[str, list]) -> dict:
    """An epoch's metrics of the engine's ``parts`` (a denoiser's statistics; diagnostics, NOT
    private) from their statistics of each step by key."""
    metrics: dict = {}
    for part in parts:
        metrics.update(part.epoch_metrics(steps[part.key]))
    return metrics


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _given(**options: object) -> dict:
    """The options that are set (not None)."""
    return {k: v for k, v in options.items() if v is not None}


def backbone_options(cfg: TrainConfig) -> dict:
    """The options the model builder takes: ``peft``, ``weights`` and the config's ``model_options``."""
    return {**_given(peft=cfg.peft, weights=cfg.weights), **cfg.model_options}


def load_training_data(cfg: TrainConfig, model_options: dict) -> DatasetSplits:
    """The run's dataset, prepared for its model: the backbone's input spec (resolution and
    normalisation, or tokenizer) plus the config's data options. A dataset that cannot be prepared
    for the backbone (e.g. 8×8 digits for a ViT) is refused, saying so."""
    check_pairing(cfg.model, cfg.dataset)
    prepared = data_options(cfg.model, dataset_task(cfg.dataset), **model_options)
    if cfg.dataset in DATASETS:
        check_options("dataset", cfg.dataset, DATASETS[cfg.dataset], prepared, implicit=("seed",),
                      why=f"model {cfg.model!r} needs its inputs prepared with them")
    split = cfg.seed if cfg.split_seed is None else cfg.split_seed
    options = {**prepared, **_given(**{name: getattr(cfg, name) for name in names(spec="dataset")})}
    key = repr((cfg.dataset, split, sorted(options.items())))
    if key not in _LOADED:   # the next trial of a reused Ray worker skips reading and tokenising again
        while len(_LOADED) >= LOADED_KEPT:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_dataset(cfg.dataset, seed=split, **options)
    return _LOADED[key]


#: Datasets a process keeps loaded (oldest dropped first): a sweep's trials interleave their seeds,
#: and each seed is its own split. Splits are read-only during training.
LOADED_KEPT = 8
_LOADED: dict[str, DatasetSplits] = {}


class Trainer:
    """State and loop of one run; ``run_epoch`` trains to the next epoch boundary and evaluates."""

    def __init__(self, cfg: TrainConfig, data: DatasetSplits | None = None, *, workers: Workers | None = None) -> None:
        self.cfg = cfg.validate()
        self.workers = workers or Workers()  # W data-parallel workers (distributed.py); one by default
        self.device = resolve_device(cfg.device)
        # every random stream of the run (randomness.py): seeded and reproducible, or secret (one
        # secret per run, shared by its workers only)
        secret = self.workers.shared(new_secret) if cfg.randomness == "secure" else None
        self.streams = {name: stream(cfg.randomness, name, seed=cfg.seed, secret=secret, device=self.device)
                        for name in STREAMS}
        torch.manual_seed(self.streams["init"].seed())   # model initialisation and dropout
        model_options = backbone_options(cfg)
        self.data = data or load_training_data(cfg, model_options)
        if cfg.validation_fraction > 0:
            self.data = with_validation(self.data, cfg.validation_fraction,
                                        cfg.seed if cfg.split_seed is None else cfg.split_seed)
        self.n_train = len(self.data.train)   # what is trained on: q = B/N and σ are for this N
        self.plan = plan_privacy(cfg, self.n_train)
        self.model = self.build_model(model_options).to(self.device)
        self.task = task_of(self.data)
        self.trainable, self.total_params = parameter_summary(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(cfg.optimizer, params, lr=cfg.learning_rate, momentum=cfg.momentum,
                                        weight_decay=cfg.weight_decay)
        self.sampler = PoissonSampler(self.n_train, self.plan.sample_rate, stream=self.streams["sampler"])
        self.engine = None
        #: the non-private baseline's step (a pack's replaces it: :mod:`.pack_training`)
        self.baseline = None if cfg.private else Baseline(self.model, self.task.loss, workers=self.workers,
                                                          precision=Precision(cfg.precision))
        if cfg.private:
            self.engine = DPEngine(self.model, self.task.loss, clip_bound=cfg.clip_bound,
                                   noise_multiplier=self.plan.noise_multiplier, expected_batch_size=cfg.batch_size,
                                   norm_estimator=cfg.norm_estimator, sketch_k=cfg.sketch_k, clip_fn=cfg.clip_fn,
                                   max_physical_batch_size=cfg.max_physical_batch_size,
                                   generator=self.streams["noise"], probes=self.streams["probes"],
                                   all_reduce=self.workers.sum if self.workers.size > 1 else None,
                                   precision=cfg.precision, **engine_parts(cfg))
        self.step = 0
        self.epoch = 0
        self.train_time_s = 0.0
        self.histories: list[list[dict]] = [[]]   # one member's (:class:`.epoch_loop.Run`)
        self.errors: list[str | None] = [None]
        self.retired = False

    def build_model(self, model_options: dict) -> nn.Module:
        """The run's model, before the optimizer and the engine see it (the audit's trainer adds
        its canary head here: :mod:`.audit.run`). With ``peft: head`` it is the head alone and the data
        are the frozen backbone's features, computed once and shared (:mod:`.frozen_features`)."""
        model = create_model(self.cfg.model, num_classes=self.data.num_classes, input_shape=self.data.input_shape,
                             task=self.data.task, **model_options)
        self.features_source = None
        if model_options.get("peft") == "head":
            cached = head_on_features(model.to(self.device), self.data, self.device)
            if cached is not None:
                model, self.data, self.features_source = cached
        return model

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.cfg.epochs)

    @functools.cached_property
    def epoch_ends(self) -> list[int]:
        """Step count at the end of each epoch (the last ends at T)."""
        return epoch_end_steps(self.cfg.epochs, self.plan.steps)

    @functools.cached_property
    def epoch_epsilons(self) -> list[float]:
        """ε spent at the end of every epoch (:func:`epoch_epsilons`)."""
        return epoch_epsilons(self.cfg, self.plan)

    @property
    def done(self) -> bool:
        return self.step >= self.plan.steps or self.retired

    def retire(self, k: int = 0, why: str | None = None) -> None:
        """The run trains no more (``why``: its error, when it diverged)."""
        self.retired, self.errors[k] = True, why

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """One optimizer step on a Poisson batch; returns (norms, their groups: the labels of a
        classification, the engine's step statistics) when private. The norms stay on the device
        (moved once per epoch: no synchronisation per step); a pack's are [K, b] (:mod:`.pack_training`
        steps its packed engine and optimizer with this same step)."""
        idx = self.workers.shard(self.sampler.sample(), self.n_train)  # the global batch's part on this worker
        x, y = take(self.data.train, idx)
        groups = self.task.groups(y)
        x, y = to_device(x, self.device), y.to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        out = None
        if self.engine is not None:
            stats = self.engine.private_gradient(x, y)
            out = (stats["norms"].detach(), groups, stats)
            self.optimizer.step()
        elif self.baseline(x, y):
            self.optimizer.step()   # non-private baseline: the mean loss over the (global) realised batch
        self.step += 1
        if self.step == 1:
            mark("first_step")
        return out

    def train_epoch(self, progress: tqdm | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, list]]:
        """Train to the end of the next epoch: the steps' per-sample norms on this worker ([n], a pack's
        [K, n]; on the CPU), their groups [n] and each engine part's step statistics by key."""
        self.epoch += 1
        start = time.perf_counter()
        norms, labels = [], []
        parts = {part.key: [] for part in (self.engine.parts if self.engine is not None else [])}
        while self.step < self.epoch_ends[self.epoch - 1]:
            result = self.train_step()
            if result is not None:
                norms.append(result[0])
                labels.append(result[1])
                for key, steps in parts.items():
                    steps.append(result[2][key])
            if progress is not None:
                progress.update(1)
        self.train_time_s += time.perf_counter() - start
        members = () if self.engine is None or not self.engine.packed else (self.engine.members,)
        all_norms = torch.cat(norms, dim=-1).cpu() if norms else torch.zeros(*members, 0)
        all_labels = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)
        return all_norms, all_labels, parts

    def epoch_metrics(self, norms: torch.Tensor, labels: torch.Tensor, clip_bound: float, epsilon: float) -> dict:
        """The metrics of an epoch that ends now, of the model as it is: the evaluation, ε spent and the
        statistics of the epoch's per-sample norms at ``clip_bound`` (NOT private)."""
        return {"epoch": self.epoch, "step": self.step, "train_time_s": self.train_time_s, **self.evaluation(),
                "epsilon_spent": epsilon, **norm_metrics(norms, labels, clip_bound)}

    def run_epoch(self, progress: tqdm | None = None) -> dict:
        """Train to the end of the next epoch, evaluate, and return the epoch's metrics."""
        norms, labels, parts = self.train_epoch(progress)
        if self.engine is None:
            return self.baseline_metrics()
        norms, labels = self.workers.gather(norms), self.workers.gather(labels)  # all shards
        return {**self.epoch_metrics(norms, labels, self.cfg.clip_bound, self.epoch_epsilons[self.epoch - 1]),
                **part_metrics(self.engine.parts, parts)}

    def baseline_metrics(self) -> dict:
        """The metrics of a non-private epoch that ends now: the evaluation, no ε (infinite) and no norms."""
        return {"epoch": self.epoch, "step": self.step, "train_time_s": self.train_time_s, **self.evaluation(),
                "epsilon_spent": math.inf}

    def epoch_results(self, progress: tqdm | None = None) -> list[dict]:
        """:meth:`run_epoch` as the loop takes it: the metrics of the run's one member."""
        return [self.run_epoch(progress)]

    def evaluation(self) -> dict:
        """The model's metrics now: test (and validation, NOT private) loss and accuracy or NLL,
        a generation task's scores at the end; with private selection only its noisy score, at the end."""
        if self.cfg.score_noise is not None:   # private selection: one noisy look at validation, at the end
            return self.noisy_score() if self.done else {}
        metrics = self.task.evaluate(self.model, self.data.test, self.device, "test")
        if self.data.validation is not None:   # what a search selects on: NOT private
            metrics.update(self.task.evaluate(self.model, self.data.validation, self.device, "validation"),
                           validation_nonprivate=True)
        if isinstance(self.task, Generation):
            metrics.update(self.generation_metrics())
        return metrics

    def fit(self, report: Report | None = None, *, state: dict | None = None,
            progress: tqdm | None = None) -> list[dict]:
        """Train to step T (:func:`.epoch_loop.fit`), calling ``report(metrics, history)`` after every
        epoch, and return the history. ``state`` (a :meth:`checkpoint`) resumes a run; one restored at
        its end reports its last epoch again, so its caller sees a final result. A loss that is no
        longer finite raises :class:`TrialDiverged`, after that epoch is reported."""
        fit_run(self, None if report is None else lambda epoch: report(epoch[0], self.histories[0]),
                state=state, progress=progress)
        if self.errors[0] is not None:
            raise TrialDiverged(self.errors[0])
        return self.histories[0]

    def generation_metrics(self) -> dict:
        """A generation task's over-long examples (every epoch), and at the end of training greedy
        completions of the test prompts scored with ROUGE-L and BLEU (``generation_examples``: how
        many; 0: none)."""
        metrics = {f"truncated_{split}_examples": n for split, n in self.data.truncated.items()}
        if self.done and self.cfg.generation_examples != 0:
            start = time.perf_counter()
            metrics.update(self.task.generate(self.model, self.data.generations, self.device,
                                              examples=self.cfg.generation_examples,
                                              max_new_tokens=self.cfg.max_new_tokens),
                           generation_time_s=time.perf_counter() - start)
        return metrics

    def noisy_score(self) -> dict:
        """Private selection ("Hyperparameter Tuning with Renyi Differential Privacy", Papernot &
        Steinke, ICLR 2022): the validation accuracy plus N(0, score_noise²) noise (sensitivity 1/n_val,
        accounted by the planner), drawn from the run's ``score`` stream. The run's only look at the
        validation data; the test data is not touched."""
        accuracy = self.task.evaluate(self.model, self.data.validation, self.device, "validation")["validation_accuracy"]
        noise = self.streams["score"].normal((), dtype=torch.float64, device=torch.device("cpu"))
        return {"selection_score": accuracy + self.cfg.score_noise * float(noise)}

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trainable parameters and the buffers: frozen weights are rebuilt from the config."""
        return {**{n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad},
                **dict(self.model.named_buffers())}

    def state_dict(self) -> dict:
        """Everything a resumed run needs: trainable weights, optimizer, the streams' states (none of
        a secure run's: its secret is never written), counters."""
        return {"model": self.trainable_state(), "optimizer": self.optimizer.state_dict(),
                "streams": {name: s.state() for name, s in self.streams.items()}, "randomness": self.cfg.randomness,
                "workers": self.workers.size, "torch_rng": torch.get_rng_state(), "step": self.step,
                "epoch": self.epoch, "train_time_s": self.train_time_s, "config": self.cfg.to_dict()}

    def checkpoint(self) -> dict:
        """What a trial's checkpoint holds: the :meth:`state_dict` and the history so far."""
        return {"trainer": self.state_dict(), "history": list(self.histories[0])}

    def restore(self, state: dict) -> None:
        """Resume from a :meth:`checkpoint`."""
        self.load_state_dict(state["trainer"])
        self.histories = [list(state["history"])]

    def load_state_dict(self, state: dict) -> None:
        check_workers(state, self.workers.size)
        missing = set(self.trainable_state()) - set(state["model"])
        if missing:
            raise UserError(f"checkpoint lacks trainable tensors: {', '.join(sorted(missing))}")
        self.model.load_state_dict(state["model"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        for name, saved in state["streams"].items():   # a secure run continues with fresh secret streams
            self.streams[name].load(saved)
        torch.set_rng_state(state["torch_rng"])
        self.step, self.epoch, self.train_time_s = state["step"], state["epoch"], state["train_time_s"]


def train(cfg: TrainConfig, *, progress: bool = True, on_epoch: Callable[[dict], None] | None = None,
          data: DatasetSplits | None = None) -> list[dict]:
    """Run a whole training without Ray, with a progress bar; returns the per-epoch metrics."""
    trainer = Trainer(cfg, data)
    with tqdm(total=trainer.plan.steps, disable=not progress, unit="step", desc="training") as bar:
        def report(metrics: dict, history: list) -> None:
            bar.set_postfix(acc=f"{metrics.get('test_accuracy', math.nan):.3f}", eps=f"{metrics['epsilon_spent']:.2f}")
            if on_epoch is not None:
                on_epoch(metrics)

        return trainer.fit(report, progress=bar)
