"""The cost model's side of the database: which machine a prediction is for (choose_machine), its
done runs (machine_rows), its fitted model cached per database and run count (model_of, which the ETA
and the report's learning section share), and the `predict` command's document (predict, with the
time to a validation loss from every machine's learning curves: time_to_loss). The model itself, and
its validation, are orchestrator/stats/cost_model.py: rows in, numbers out.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import text

from common import variables as V
from common.compute import param_counts
from common.errors import BadInput, BenchError
from common.tokens import tokens_per_word
from orchestrator.stats.cost_model import LEVEL, Model, Prediction, calibrate, check, fit, usable

SELECT_MACHINES = """
SELECT m.machine_id, m.hostname, m.cpu_model, m.logical_cores, m.fingerprint, COUNT(r.run_id)
FROM machines m JOIN runs r ON r.machine_id = m.machine_id
WHERE r.status = 'done'
GROUP BY m.machine_id, m.hostname, m.cpu_model, m.logical_cores, m.fingerprint
ORDER BY m.machine_id
"""
SELECT_DONE = "SELECT * FROM v_results WHERE machine_id = :machine_id AND status = 'done' ORDER BY run_id"
# Every learning run's final curve, and what its run says of its evaluations (bench.py predict --to-loss).
SELECT_LEARNING_RUNS = """
SELECT r.run_id, r.dataset_used, r.eval_s, r.step_ms_median, j.config
FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.status = 'done' AND j.max_tokens IS NOT NULL
"""
SELECT_FINAL_CURVES = "SELECT run_id, tokens, val_loss FROM v_curves WHERE final ORDER BY run_id, step"
# Word-level token counts of the training splits (Merity et al. 2016, after the Moses tokenizer); the
# datasets cannot be downloaded here, so their published sizes are used.
DATASET_WORDS = {"wikitext-2": 2_088_628, "wikitext-103": 103_227_021}


@dataclass(frozen=True)
class MachineRow:
    machine_id: int
    hostname: str
    cpu_model: str
    logical_cores: int
    fingerprint: str
    done_runs: int

    @property
    def label(self) -> str:
        return f"{self.machine_id} ({self.hostname}, {self.cpu_model}, {self.done_runs} done runs)"


def machines(store) -> list[MachineRow]:
    """The machines of the database with at least one done run."""
    with store.transaction() as conn:
        return [MachineRow(*r) for r in conn.execute(text(SELECT_MACHINES)).all()]


def choose_machine(store, machine: str | None, here: str | None = None) -> MachineRow:
    """The machine named by id, hostname or fingerprint; without a name, this host (by hostname) when it
    has runs, else the only machine. BadInput naming the machines otherwise."""
    known = machines(store)
    if not known:
        raise BadInput("no machine of this database has a done run: nothing to predict from")
    names = "; ".join(m.label for m in known)
    if machine is not None:
        hits = [m for m in known if machine in (str(m.machine_id), m.hostname, m.fingerprint)]
        if len(hits) != 1:
            what = "names several machines" if hits else "is no machine with done runs"
            raise BadInput(f"--machine {machine!r} {what} of this database: {names}")
        return hits[0]
    if len(known) == 1:
        return known[0]
    mine = [m for m in known if here is not None and m.hostname == here]
    if len(mine) == 1:
        return mine[0]
    raise BadInput(f"this database holds {len(known)} machines; name one with --machine ID|HOSTNAME: {names}")


def machine_rows(store, machine_id: int) -> list[dict]:
    """Every done run of the machine, with v_results' columns, in run order."""
    with store.transaction() as conn:
        return [dict(r._mapping) for r in conn.execute(text(SELECT_DONE), {"machine_id": machine_id})]


_models: dict[tuple, Model] = {}


def model_of(store, machine_id: int, calibrated: bool = False) -> Model:
    """The fitted model of one machine (cached per database and run count); `calibrated`: with its
    model error (calibrate() on the report's check(): one refit per configuration checked, seconds; the
    ETA's point predictions need no interval and skip it)."""
    rows = usable(machine_rows(store, machine_id))
    key = (store.url, machine_id, len(rows), rows[-1]["run_id"] if rows else None, calibrated)
    if key not in _models:
        model = fit(rows)
        if calibrated:
            entries, used = check(rows)
            calibrate(model, used, entries)
        _models[key] = model
    return _models[key]


def predict(store, settings: dict, *, machine: str | None = None, here: str | None = None,
            tokens: float | None = None, epochs: float | None = None, dataset: str | None = None,
            to_loss: float | None = None) -> dict:
    """THE entry point: the predicted median step time of `settings` (parsed K=V, the catalogue's
    defaults filling the rest, resolved on the chosen machine's CPUs) with its 95% interval, what it
    rests on, what it extrapolates, and with tokens (or epochs of a named dataset) the training time;
    with to_loss, the time to that validation loss (time_to_loss()). BadInput for input that cannot
    be a job; BenchError for what the model refuses."""
    if to_loss is not None and not (math.isfinite(to_loss) and to_loss > 0):
        raise BadInput(f"--to-loss must be a positive number, got {to_loss}")
    if to_loss is not None and (tokens is not None or epochs is not None):
        raise BadInput("give --to-loss, or --tokens / --epochs: the tokens to a loss are what --to-loss predicts")
    if (epochs is None) != (dataset is None):
        raise BadInput("--epochs and --dataset go together (the dataset's token count times the epochs)")
    if tokens is not None and epochs is not None:
        raise BadInput("give --tokens or --epochs with --dataset, not both")
    if dataset is not None and dataset not in DATASET_WORDS:
        raise BadInput(f"--dataset {dataset!r}: known datasets are {', '.join(DATASET_WORDS)}")
    for value, name in ((tokens, "--tokens"), (epochs, "--epochs")):
        if value is not None and not value > 0:
            raise BadInput(f"{name} must be positive, got {value}")
    chosen = choose_machine(store, machine, here)
    config, why = V.resolve(settings, chosen.logical_cores)
    if why:
        raise BadInput(f"this configuration cannot run: {'; '.join(why)}")
    model = model_of(store, chosen.machine_id, calibrated=True)
    p = model.predict(config)
    tokens_per_step = config["batch_size"] * config["grad_accum"] * config["seq_len"]
    doc = {"step_ms": p.step_ms, "step_ms_low": p.step_ms_low, "step_ms_high": p.step_ms_high,
           "level": LEVEL, "basis": p.basis, "extrapolated": p.extrapolated,
           "machine": {"machine_id": chosen.machine_id, "hostname": chosen.hostname, "cpu_model": chosen.cpu_model},
           "flops_per_step": p.flops_per_step, "params": param_counts(config)["params"],
           "tokens_per_step": tokens_per_step}
    if epochs is not None:
        ratio, where = tokens_per_word(config["vocab_size"])
        tokens = DATASET_WORDS[dataset] * ratio * epochs
        doc["tokens_basis"] = (f"{dataset}: {DATASET_WORDS[dataset]:,} word-level tokens x {ratio:.3f} tokens per "
                               f"word (the run's BPE, vocab {config['vocab_size']}, measured on {where}) x {epochs:g} "
                               f"epoch(s)")
    if tokens is not None:
        doc.update(p.train(tokens_per_step, tokens))
        doc["tokens"] = tokens
    if to_loss is not None:
        doc.update(time_to_loss(store, config, p, to_loss))
    return doc


def time_to_loss(store, config: dict, p: Prediction, loss: float) -> dict:
    """The time to validation loss `loss`: tokens to it from a law fitted to every machine's learning
    curves (orchestrator/stats/learning.py: learning is portable, step time is not) over tokens per step x
    this machine's predicted step time, plus evaluations (every eval_every tokens: the config's, else
    the learning runs' median) at the learning runs' ratio of an evaluation to a training token's time.
    The 95% interval joins the law's (seed-to-seed spread included) and the step time's on the log scale."""
    from orchestrator.stats import learning  # here: it imports scipy, which only a loss needs

    with store.transaction() as conn:
        runs = conn.execute(text(SELECT_LEARNING_RUNS)).all()
        curves: dict[int, list] = defaultdict(list)
        for run_id, tokens, val_loss in conn.execute(text(SELECT_FINAL_CURVES)):
            curves[run_id].append((tokens, val_loss))
    observations, seen, eval_ratios, cadences = [], set(), [], []
    for run_id, dataset_used, eval_s, step_ms, config_json in runs:
        if run_id not in curves:
            continue
        run_config = V.complete(json.loads(config_json)) | {"dataset_used": dataset_used}
        values = learning.law_values(run_config)
        key = (tuple(sorted((k, str(v)) for k, v in values.items())), V.run_seed(run_config))
        if key in seen:
            continue  # a seed run again (an OFAT baseline in every block) is one observation
        seen.add(key)
        observations.append((values, learning.tokens_to(curves[run_id], loss)))
        cadences.append(int(run_config["eval_every"]))
        if eval_s and step_ms:
            per_token_s = step_ms / 1e3 / V.tokens_per_step(run_config)
            eval_ratios.append(eval_s / len(curves[run_id]) / per_token_s)
    if not observations:
        raise BenchError("no learning run (max_tokens) is done in this database: tokens to a loss were never measured")
    law = learning.fit_law(observations, loss)
    values = learning.law_values(config | {"dataset_used": _learning_text(config, observations)})
    if why := law.refusal(values):
        raise BenchError(f"{why}; {law.runs} learning runs reached {loss:g}")
    t = law.predict(values)
    tokens = t["tokens_to_target"]
    per_step = V.tokens_per_step(config)
    cadence = int(config["eval_every"]) if V.is_learning(config) else int(statistics.median(cadences))
    per_eval_s = statistics.median(eval_ratios) * p.step_ms / 1e3 / per_step if eval_ratios else 0.0
    train_s = tokens / per_step * p.step_ms / 1e3
    eval_s = math.ceil(tokens / cadence) * per_eval_s
    half = math.sqrt(t["log_half_width"] ** 2 + (math.log(p.step_ms_high / p.step_ms_low) / 2) ** 2)
    total = train_s + eval_s
    return {"to_loss": loss, "tokens_to_target": tokens, "tokens_to_target_low": t["tokens_to_target_low"],
            "tokens_to_target_high": t["tokens_to_target_high"], "steps_to_target": tokens / per_step,
            "time_to_target_s": total, "time_to_target_s_low": total * math.exp(-half),
            "time_to_target_s_high": total * math.exp(half), "eval_s": eval_s,
            "learning_extrapolated": t["extrapolated"],
            "learning_basis": (f"tokens to {loss:g}: a law fitted to {law.runs} learning runs' curves "
                               f"({law.configurations} configurations"
                               f"{f'; {law.censored} left out: their curves never came to it' if law.censored else ''}"
                               "), "
                               f"log tokens linear in log {', '.join(law.numeric) or 'nothing'}"
                               f"{' (lr also squared)' if law.squared else ''} with factors for "
                               f"{', '.join(law.levels) or 'nothing'}, {law.dof} residual dof; evaluations every "
                               f"{cadence:,} tokens at {statistics.median(eval_ratios) if eval_ratios else 0:.3g} "
                               f"training tokens' time each")}


def _learning_text(config: dict, observations: list) -> str:
    """The text a prediction's learning is read on: the config's dataset, or what the learning runs of
    that dataset really trained on (the hub's name falls back to shakespeare here)."""
    used = {v["dataset_used"] for v, _ in observations}
    return config["dataset"] if config["dataset"] in used or len(used) != 1 else next(iter(used))
