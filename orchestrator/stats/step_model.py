"""The one statistical model of a machine's runs: log step time = configuration + block + residual.

Every comparison the report makes (a value against its baseline, a power law, an interaction) is a
linear contrast of the configuration effects fitted here once, so all of them share one noise
estimate and one set of degrees of freedom:

    y_i = mu[config_i] + gamma[block_i] + delta_s * z_i + e_i,     e_i ~ N(0, sigma_s^2)

- mu: one effect per configuration (the fast-mode log step time).
- gamma: one effect per block, i.e. per (repeat pass, block) of the run order (jobs.block: a
  comparison's configurations run next to each other; NULL: the whole pass is the block). Slow drift
  of the machine and the correlated noise of a stretch of time live here. Fixed effects: estimated
  inside the model, one per block, their degrees of freedom paid. One block per connected part of
  the design is the reference (its gamma is 0): only differences between configurations that share
  blocks, directly or through other configurations, are estimable, and the others are said to be not.
- s: the noise stratum of a run (its number of CPUs: 1-thread and 2-thread runs of a shared VM are
  not equally noisy). Each stratum has its own residual variance sigma_s^2 when it has at least
  MIN_STRATUM_DF degrees of freedom of its own; smaller strata share the largest one's.
- z_i: a slow mode. Shared VMs are bimodal (about a third of 2-thread runs 12-15% slower with no
  sensor seeing why) and heavy-tailed. Per stratum, an EM fit of a two-component mixture on the
  residuals: a run is in the slow mode with probability pi_s and is then delta_s slower, with its
  own spread. It is kept only where it clearly beats one normal (BIC, separated modes); the
  configuration effects are then the fast mode's, and slow runs weigh little in them.

Weighted least squares with weights 1/sigma^2 (of the component a run is in, in expectation), a
sparse solve of the normal equations; a contrast's standard error is sqrt(a' A^-1 a), its degrees
of freedom Satterthwaite's over the strata's residual degrees of freedom (leverages subtracted).

Pure numpy/scipy; no I/O and no knowledge of variables: effects.py says which contrasts to make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import splu

MIN_STRATUM_DF = 10  # residual degrees of freedom a stratum needs to keep a variance of its own
MIX_MIN_RUNS = 20  # runs a stratum needs before a slow mode is looked for
MIX_MIN_SHARE, MIX_MAX_SHARE = 0.03, 0.5  # a slow "mode" outside these shares is not one
MIX_SEPARATION = 2.5  # the slow mode must sit this many fast-mode sigmas above it
EM_ITERATIONS = 60
DENSE_LEVERAGE_MAX = 3000  # parameters up to which leverages are exact (dense inverse)


@dataclass
class Stratum:
    """The residual noise of one group of runs (same number of CPUs)."""

    key: object
    runs: int
    sigma2: float  # residual variance of log step time (fast mode)
    dof: float  # residual degrees of freedom
    slow_share: float = 0.0  # pi: share of runs in the slow mode (0: no slow mode)
    slow_shift: float = 0.0  # delta: the slow mode's extra log step time (same spread as the fast mode)
    members: tuple = ()  # the stratum keys merged into this one (too few runs of their own)
    own_sigma2: float = float("nan")  # its residual variance as measured here, before the machine's prior
    own_dof: float = 0.0  # the degrees of freedom of that (dof less the prior's)
    config_prior: tuple | None = None  # (d0, s0^2) of its configurations' variances (_own_variances); None: not read

    @property
    def cv(self) -> float:
        return math.sqrt(math.expm1(self.sigma2))

    @property
    def noisy_config(self) -> bool:
        """A configuration far noisier than the rest, with a variance of its own."""
        return _is_noisy_key(self.key)

    @property
    def bimodal(self) -> bool:
        return self.slow_share > 0


@dataclass
class Contrast:
    estimate: float  # on the log scale
    se: float | None  # None: no residual degrees of freedom (nothing repeated)
    dof: float | None


@dataclass
class Fit:
    """The fitted model of one machine's runs."""

    mu: np.ndarray  # fast-mode log step time per configuration (relative to its part's reference block)
    gamma: np.ndarray  # per block
    strata: dict  # stratum key -> Stratum (merged strata map to the same object)
    component: np.ndarray  # connected part of each configuration
    slow_prob: np.ndarray  # per run: posterior probability of the slow mode (0 where none was fitted)
    n_runs: int
    _solve: object = field(repr=False, default=None)
    # (X sparse n x p, weights, noise source per run, dof per source, excess per run)
    _design: object = field(repr=False, default=None)
    prior: "Prior | None" = None  # the machine's prior the strata were moderated toward (moderate_strata)
    blocks_dropped: bool = False  # the design left too few degrees of freedom to pay for block effects

    @property
    def dof(self) -> float:
        return float(sum(s.dof for s in self.distinct_strata()))

    def distinct_strata(self) -> list[Stratum]:
        return list({id(s): s for s in self.strata.values()}.values())

    @property
    def sigma2(self) -> float | None:
        """The pooled fast-mode residual variance (degrees-of-freedom weighted)."""
        ss = [s for s in self.distinct_strata() if s.dof > 0]
        if not ss:
            return None
        return sum(s.sigma2 * s.dof for s in ss) / sum(s.dof for s in ss)

    def block_variance(self) -> float | None:
        """Kalibera & Jones' second level: how much the blocks (stretches of time) vary beyond what the
        runs inside them do: the variance of the fitted block effects minus their own noise."""
        if len(self.gamma) < 3 or self.sigma2 is None:
            return None
        g = self.gamma - self.gamma.mean()
        return max(0.0, float(g.var(ddof=1)) - self.sigma2 * 2.0 / max(1.0, self.n_runs / len(self.gamma)))

    def contrast(self, weights: dict[int, float]) -> Contrast | None:
        """a' mu for a = weights (configuration index -> coefficient); None when not estimable (the
        coefficients of some connected part of the design do not sum to zero)."""
        # the weights as arrays (a contrast of a fleet's machine weighs thousands of configurations); each
        # sum below adds in the weights' order from 0.0, as the loops over them did: the same floats
        at = np.fromiter(weights.keys(), dtype=np.intp, count=len(weights))
        w = np.fromiter(weights.values(), dtype=float, count=len(weights))
        parts = np.bincount(self.component[at], weights=w) if len(at) else w
        if np.any(np.abs(parts) > 1e-9):
            return None
        est = float(np.add.accumulate(np.concatenate(([0.0], w * self.mu[at])))[-1])
        X, _, _, s_dof, _ = self._design
        if self._solve is None or not s_dof:
            return Contrast(est, None, None)
        a = np.zeros(X.shape[1])
        a[at] = w
        z = self._solve(a)
        # Satterthwaite over the noise sources (strata, and configurations noisier than their stratum):
        # Var = sum_i w_i^2 (x_i'z)^2 sigma_i^2, sigma_i^2 = excess_i / w_i (excess: 1 but where a
        # configuration's own variance exceeds its stratum's, see fit()), summed over the runs that share
        # a row of X and a noise source first (_cells): one term per (configuration, block, source).
        extra = self._extra()
        if extra is None and len(s_dof) == 1 and getattr(self._solve, "__self__", None) is not None \
                and self._solve.__self__._cho is not None:
            # one noise source and no excess variance: Var = a'z, and Satterthwaite's degrees of freedom
            # over one source, total^2 / (total^2 / dof), are that source's own (no pass over the cells)
            var = float(a @ z)
            return Contrast(est, math.sqrt(var) if var > 0 else 0.0, float(sum(s_dof.values())))
        Xu, wu, wu_excess, su = self._cells()
        xz2, wx = self._cell_buffers(Xu.shape[0])
        _csr_matvec(Xu, z, xz2)
        np.square(xz2, out=xz2)  # (Xu @ z) ** 2, into a buffer of the fit's (no fresh array per contrast)
        # extra = 0 for every cell (no configuration with an excess variance): its term is 0.0 exactly
        var = float(a @ z) + (float(extra @ xz2) if extra is not None else 0.0)
        if var <= 0:
            return Contrast(est, 0.0, float(sum(s_dof.values())))
        sums = np.bincount(su, weights=np.multiply(wu_excess, xz2, out=wx))
        parts_v = {s: float(v) for s, v in enumerate(sums) if v > 0}
        total = sum(parts_v.values())
        denom = sum(v * v / s_dof[s] for s, v in parts_v.items() if s_dof.get(s, 0) > 0 and v > 0)
        dof = total * total / denom if denom > 0 else float(sum(s_dof.values()))
        return Contrast(est, math.sqrt(var), dof)

    def _cells(self):
        """(the distinct rows of X with their noise source, the runs' summed weights per such row, the
        same weighted by each run's excess variance, its source): a contrast's variance and its
        per-source sums run over these, O(cells) rather than O(runs)."""
        if "_cells_of" not in self.__dict__:
            X, wts, s_of_run, _, excess = self._design
            X = X.tocsr().sorted_indices()
            counts = np.diff(X.indptr)
            width = int(counts.max(initial=0))
            key = np.full((X.shape[0], 2 * width + 1), -1.0)
            key[:, 0] = s_of_run
            for k in range(width):  # each row's k-th entry: its column and its value
                has = counts > k
                key[has, 1 + 2 * k] = X.indices[X.indptr[:-1][has] + k]
                key[has, 2 + 2 * k] = X.data[X.indptr[:-1][has] + k]
            # np.unique(key, axis=0, return_index=True, return_inverse=True), from one stable lexsort of
            # the columns (np.unique sorts the rows as records, stably, far slower at a million runs):
            # the same cells in the same order, each with its first run
            order = np.lexsort(key.T[::-1])
            sk = key[order]
            starts = np.ones(len(order), dtype=bool)
            starts[1:] = np.any(sk[1:] != sk[:-1], axis=1)
            first = order[starts]
            inverse = np.empty(len(order), dtype=np.intp)
            inverse[order] = np.cumsum(starts) - 1
            self.__dict__["_cells_of"] = (X[first], np.bincount(inverse, weights=wts, minlength=len(first)),
                                          np.bincount(inverse, weights=wts * excess, minlength=len(first)),
                                          np.asarray(s_of_run)[first])
        return self.__dict__["_cells_of"]

    def _cell_buffers(self, cells: int):
        """Two arrays of one value per cell, reused by every contrast of this fit."""
        if "_cell_buf" not in self.__dict__:
            self.__dict__["_cell_buf"] = (np.empty(cells), np.empty(cells))
        return self.__dict__["_cell_buf"]

    def _extra(self):
        """wu_excess - wu per cell (the excess variance's share of a contrast's variance), or None where
        it is 0 for every cell."""
        if "_extra_of" not in self.__dict__:
            if np.all(self._design[4] == 1.0):  # w * 1 = w: every cell's two sums are equal
                self.__dict__["_extra_of"] = None
                return None
            _, wu, wu_excess, _ = self._cells()
            extra = wu_excess - wu
            self.__dict__["_extra_of"] = extra if extra.any() else None
        return self.__dict__["_extra_of"]

    def covariance(self, vectors: list[dict[int, float]]) -> np.ndarray:
        """The covariance matrix of several contrasts (each estimable)."""
        X = self._design[0]
        a = np.zeros((X.shape[1], len(vectors)))
        for j, weights in enumerate(vectors):
            for c, w in weights.items():
                a[c, j] = w
        z = np.column_stack([self._solve(a[:, j]) for j in range(len(vectors))])
        extra = self._extra()
        out = a.T @ z
        if extra is None:  # no excess variance anywhere: every slice would add 0.0
            return out
        Xu = self._cells()[0]
        # by slices of the cells: at a million runs X z for an interaction's contrasts is gigabytes.
        # A slice whose cells all have extra = 0 (no configuration with an excess variance in it: the
        # cells are sorted by noise source, so the excess ones sit together at the end) adds a matrix
        # of exact +0.0 (finite z): skipped, its one effect on out (-0.0 -> +0.0) kept by out += 0.0.
        step = max(1, COVARIANCE_CHUNK // max(1, len(vectors)))
        finite = bool(np.isfinite(z).all())
        skipped = False
        for lo in range(0, Xu.shape[0], step):
            if finite and not extra[lo:lo + step].any():
                skipped = True
                continue
            xz = Xu[lo:lo + step] @ z
            out += xz.T @ (extra[lo:lo + step, None] * xz)
        if skipped:
            out += 0.0
        return out


def _csr_matvec(A, x, out) -> None:
    """out = A @ x for a CSR matrix A, into out: what A @ x computes (scipy's csr_matvec summing each
    row's entries in order into zeros), without a fresh array."""
    out.fill(0.0)
    if _sparsetools is None or A.format != "csr" or A.dtype != np.float64 or x.dtype != np.float64:
        out[:] = A @ x
        return
    _sparsetools.csr_matvec(A.shape[0], A.shape[1], A.indptr, A.indices, A.data, x, out)


try:
    from scipy.sparse import _sparsetools
except ImportError:  # a scipy without it: A @ x
    _sparsetools = None


COVARIANCE_CHUNK = 4_000_000  # values of X z held at once by Fit.covariance (32 MB)


def fit(y, config_idx, block_idx, stratum_keys, *, n_configs: int, n_blocks: int, mixture: bool = True,
        pass_idx=None, prior: tuple[float, float] | None = None) -> Fit:
    """Fit the model to log step times y; config_idx / block_idx index each run's configuration and
    block (0..n-1); stratum_keys is each run's noise stratum (any hashable). pass_idx (each run's
    repeat pass), where given, is where a slow mode is looked for: in a model of configuration +
    pass, whose residuals small blocks have not averaged away (in a block of two runs the residuals
    are +-x of each other, and a run's own slowness cannot be told from its neighbour's). prior:
    (log-scale variance, the degrees of freedom it was measured with) of what the machine is known
    to do (the probe's noise): each stratum's variance is moderated toward it (moderate_strata)."""
    y = np.asarray(y, dtype=float)
    ci = np.asarray(config_idx, dtype=int)
    fine = design(ci, np.asarray(block_idx, dtype=int), n_configs, n_blocks)
    state = FitState(y, ci, fine.X, *strata_of(stratum_keys, fine.p, len(y)))
    split_noisy(state, noisy_at_start(state, n_configs))
    fit_variances(state, 3)
    coarse = coarse_design(fine.X, ci, pass_idx, n_configs) if mixture and pass_idx is not None else None
    slow_modes(state, coarse, mixture)
    noisy = noisy_beyond_slow_modes(state, n_configs)
    if noisy:
        split_noisy(state, noisy)
        fit_variances(state, 2)
        slow_modes(state, coarse, mixture)
    eff_w, target, s_dof = final_fit(state)
    own_sigma2, own_dof = state.sigma2.copy(), dict(s_dof)
    prior_used = moderate(state, eff_w, target, s_dof, prior) if prior is not None else None
    has_noise = all(np.isfinite(state.sigma2)) and sum(s_dof.values()) >= 1
    source, excess, config_priors = state.s_of_run.copy(), np.ones(len(y)), {}
    if has_noise:
        source, excess, config_priors = config_variances(state, target, own_sigma2, s_dof, n_configs)
    strata = stratum_objects(state, own_sigma2, own_dof, s_dof, config_priors)
    gamma = np.zeros(n_blocks)
    for b, col in fine.col_of_block.items():
        gamma[b] = state.theta[col]
    return Fit(state.theta[:n_configs].copy(), gamma, strata, fine.component, state.post, len(y),
               state.lu.solve_few if has_noise else None,
               (fine.X, eff_w, source, s_dof if has_noise else {}, excess), prior=prior_used,
               blocks_dropped=fine.blocks_dropped)


# -- fit()'s steps, in the order it takes them ----------------------------------------------------


@dataclass
class Design:
    """The fine model's design: a row per run, a column per configuration and per block but each
    connected part's reference block."""

    X: sparse.csr_matrix
    p: int  # its columns
    component: np.ndarray  # the connected part of each configuration
    col_of_block: dict  # block -> its column (a reference block has none)
    blocks_dropped: bool  # the blocks cost too many degrees of freedom: every run is in block 0


def design(ci, bi, n_configs: int, n_blocks: int) -> Design:
    """The design of configuration + block, one reference block per connected part of the bipartite
    configuration-block graph (only differences inside a part are estimable); the blocks left out
    where they cost too much (_blocks_cost_too_much)."""
    n = len(ci)
    blocks_dropped = _blocks_cost_too_much(ci, bi, n_configs, n_blocks)
    if blocks_dropped:  # one block per part: the configurations' effects on their own
        bi = np.zeros(n, dtype=int)
    graph = sparse.coo_matrix((np.ones(n), (ci, n_configs + bi)), shape=(n_configs + n_blocks,) * 2)
    n_parts, labels = connected_components(graph, directed=False)
    component = labels[:n_configs]
    ref_blocks = {}
    for b in range(n_blocks):
        ref_blocks.setdefault(int(labels[n_configs + b]), b)
    free_blocks = [b for b in range(n_blocks) if ref_blocks.get(int(labels[n_configs + b])) != b]
    col_of_block = {b: n_configs + k for k, b in enumerate(free_blocks)}
    p = n_configs + len(free_blocks)
    rows, cols = [np.arange(n)], [ci]
    col_arr = np.full(n_blocks, -1, dtype=int)  # each block's column, -1: a reference block
    for b, c in col_of_block.items():
        col_arr[b] = c
    has_block = col_arr[bi] >= 0
    rows.append(np.arange(n)[has_block])
    cols.append(col_arr[bi[has_block]])
    ones = np.ones(sum(len(r) for r in rows))
    X = sparse.csr_matrix((ones, (np.concatenate(rows), np.concatenate(cols))), shape=(n, p))
    return Design(X, p, component, col_of_block, blocks_dropped)


def strata_of(stratum_keys, p: int, n: int) -> tuple[list, dict, list, np.ndarray]:
    """The noise strata: those with too few residual degrees of freedom merged into the largest.
    (every key, most runs first; key -> the stratum it is in; the strata kept; each run's stratum)."""
    keys = list(stratum_keys)
    distinct = sorted(set(keys), key=lambda k: -keys.count(k))
    approx_dof = {k: keys.count(k) * (1 - p / max(n, 1)) for k in distinct}
    big = [k for k in distinct if approx_dof[k] >= MIN_STRATUM_DF] or distinct[:1]
    home = {k: (k if k in big else big[0]) for k in distinct}
    index_of = {k: big.index(home[k]) for k in distinct}
    s_of_run = np.array([index_of[k] for k in keys]) if n else np.zeros(0, dtype=int)
    return distinct, home, big, s_of_run


class FitState:
    """fit() in progress: the runs, the design, each run's stratum, and the estimates its steps refine
    (each stratum's variance and slow mode, the runs' slow-mode posteriors, the effects, the
    leverages, the weights and their factor)."""

    def __init__(self, y, ci, X, distinct: list, home: dict, big: list, s_of_run: np.ndarray):
        n, p = len(y), X.shape[1]
        self.y, self.ci, self.X, self.p = y, ci, X, p
        self.distinct, self.home = distinct, home
        self.big = big  # the strata's keys; a noisy configuration's own appended (split_noisy)
        self.s_of_run = s_of_run
        self.sigma2 = np.full(len(big), 1.0)
        self.pi = np.zeros(len(big))
        self.delta = np.zeros(len(big))
        self.post = np.zeros(n)
        self.theta = np.zeros(p)
        self.lev = np.full(n, p / max(n, 1))
        self.weights = None
        self.lu = None
        self._last = {}  # the factor of the last weights solved with: a refit under the same weights reuses it

    @property
    def n_strata(self) -> int:
        return len(self.big)

    def solve(self, weights, target):
        """(the factor, theta) of the weighted least squares of target on X."""
        last = self._last
        if "w" not in last or not np.array_equal(last["w"], weights):
            last["w"], last["f"] = np.array(weights, copy=True), _factor(self.X, weights)
        f = last["f"]
        return f, f.solve(self.X.T @ (weights * target))

    def solver_of(self, matrix):
        """theta for a target under the current weights: the fine model's shared factor where matrix is X."""
        if matrix is self.X:
            return lambda target: self.solve(self.weights, target)
        return _solve(matrix, self.weights)


def noisy_at_start(state: FitState, n_configs: int) -> list[int]:
    """Step 0: configurations far noisier than the rest, judged on a fit that weighs each configuration
    by its own spread (so a noisy one cannot push the block effects and make its neighbours look
    noisy). Sets the state's robust weights, effects and leverages."""
    y, X = state.y, state.X
    state.weights = _robust_weights(y, state.ci, n_configs)
    state.lu, state.theta = state.solve(state.weights, y)
    _leverages(X, state.weights, state.lu, state.p, state.lev)
    return _noisy_configs(y - X @ state.theta, state.ci, state.s_of_run, state.lev, n_configs, trim=0.5,
                          trim_rest=True, centre=True, min_ratio=NOISY_MIN_RATIO)


def split_noisy(state: FitState, noisy: list[int]) -> None:
    """Each configuration of `noisy` a stratum of its own (variance 1 until fitted); every slow mode
    forgotten."""
    if not noisy:
        return
    for c in noisy:
        state.big.append(("noisy configuration", c))
    state.s_of_run = state.s_of_run.copy()
    for c in noisy:
        state.s_of_run[state.ci == c] = state.big.index(("noisy configuration", c))
    state.sigma2 = np.concatenate([state.sigma2, np.ones(len(noisy))])
    state.pi, state.delta = np.zeros(state.n_strata), np.zeros(state.n_strata)
    state.post[:] = 0.0


def fit_variances(state: FitState, rounds: int) -> None:
    """Step 1: one variance per stratum, in rounds of a weighted fit and each stratum's residual
    variance (leverages subtracted) giving the next round's weights."""
    y, X, s_of_run, sigma2, lev = state.y, state.X, state.s_of_run, state.sigma2, state.lev
    for _ in range(rounds):
        state.lu, state.theta = state.solve(state.weights, y)
        _leverages(X, state.weights, state.lu, state.p, lev)
        r = y - X @ state.theta
        for s in range(state.n_strata):
            m = s_of_run == s
            dof_s = m.sum() - lev[m].sum()
            sigma2[s] = float(r[m] @ r[m] / dof_s) if dof_s > 0.5 else float("nan")
        state.weights = np.where(np.isfinite(sigma2[s_of_run]) & (sigma2[s_of_run] > 0),
                                 1.0 / np.maximum(sigma2[s_of_run], 1e-12), 1.0)


def coarse_design(X, ci, pass_idx, n_configs: int):
    """The configuration + pass design where a slow mode is looked for, or None where it would leave
    fewer than MIN_STRATUM_DF residual degrees of freedom; X itself where it is the same matrix (every
    block a whole pass, numbered in pass order), so its fits share the fine model's factor."""
    n = len(ci)
    pi_ = np.asarray(pass_idx, dtype=int)
    passes = sorted(set(pi_.tolist()))
    col = {q: n_configs + k for k, q in enumerate(passes[1:])}
    rank = np.searchsorted(np.asarray(passes, dtype=int), pi_)  # each run's pass among passes
    keep = rank >= 1  # the first pass is the reference
    Xc = sparse.csr_matrix((np.ones(n + int(keep.sum())),
                            (np.concatenate([np.arange(n), np.arange(n)[keep]]),
                             np.concatenate([ci, n_configs + rank[keep] - 1]))),
                           shape=(n, n_configs + len(col)))
    if Xc.shape[1] < n - MIN_STRATUM_DF:
        return X if _same_matrix(Xc, X) else Xc
    return None


def slow_modes(state: FitState, coarse, mixture: bool) -> None:
    """Step 2: a slow mode per stratum, where it clearly beats one normal (_mixture); found in the
    coarse model where there is one, whose shifts the fine model then takes."""
    y, X, lev, sigma2, pi, delta = state.y, state.X, state.lev, state.sigma2, state.pi, state.delta
    thc, levc = coarse_fit(state, coarse) if coarse is not None else (None, None)
    for s in range(state.n_strata):
        m = state.s_of_run == s
        pi[s], delta[s] = 0.0, 0.0
        state.post[m] = 0.0
        if not mixture or m.sum() < MIX_MIN_RUNS or not np.isfinite(sigma2[s]) or sigma2[s] <= 0:
            continue
        if coarse is not None:
            r = y - coarse @ thc
            s2c = float(r[m] @ r[m]) / max(1.0, float(m.sum() - levc[m].sum()))
            got = _mixture(coarse, y, m, thc, levc, s2c, state.weights, state.solver_of(coarse))
            if got is None:
                continue
            _, post_m, pi_s, delta_s, _ = got
            state.post = np.where(m, post_m, state.post)
            pi[s], delta[s] = pi_s, delta_s
            target = y - np.where(m, delta_s * state.post, 0.0)
            _, state.theta = state.solve(state.weights, target)
            r = (target - X @ state.theta)[m]
            dof_s = max(1.0, float(m.sum() - lev[m].sum()) - 2)
            sigma2[s] = float(r @ r) / dof_s + delta_s * delta_s * float(np.mean(state.post[m] * (1 - state.post[m])))
            continue
        got = _mixture(X, y, m, state.theta, lev, sigma2[s], state.weights, state.solver_of(X))
        if got is None:
            continue
        state.theta, post_m, pi[s], delta[s], sigma2[s] = got
        state.post = np.where(m, post_m, state.post)


def coarse_fit(state: FitState, coarse):
    """The configuration + pass model under the current weights: (theta, leverages)."""
    luc, thc = state.solver_of(coarse)(state.y)
    levc = np.empty(len(state.y))
    _leverages(coarse, state.weights, luc, coarse.shape[1], levc)
    return thc, levc


def noisy_beyond_slow_modes(state: FitState, n_configs: int) -> list[int]:
    """Step 3: configurations far noisier than their stratum's fast mode (an F test at NOISY_ALPHA over
    the configurations tested, slow-mode runs' shift removed), not yet split off: each gets a variance
    of its own, paying its own degrees of freedom, so one noisy value widens only its own comparisons."""
    r = state.y - state.X @ state.theta - state.delta[state.s_of_run] * state.post
    return [c for c in _noisy_configs(r, state.ci, state.s_of_run, state.lev, n_configs)
            if ("noisy configuration", c) not in state.big]


def final_fit(state: FitState) -> tuple[np.ndarray, np.ndarray, dict]:
    """Step 4: the final fit, each stratum's weight, targets shifted by the slow mode's expected share:
    (the weights, the targets, each stratum's residual degrees of freedom)."""
    y, sigma2, n = state.y, state.sigma2, len(state.y)
    eff_w = np.empty(n)
    target = y.copy()
    for s in range(state.n_strata):
        m = state.s_of_run == s
        if state.pi[s] > 0:
            eff_w[m] = 1.0 / sigma2[s]
            target[m] = y[m] - state.delta[s] * state.post[m]
        else:
            eff_w[m] = 1.0 / sigma2[s] if np.isfinite(sigma2[s]) and sigma2[s] > 0 else 1.0
    state.lu, state.theta = state.solve(eff_w, target)
    _leverages(state.X, eff_w, state.lu, state.p, state.lev)
    s_dof = {}
    for s in range(state.n_strata):
        m = state.s_of_run == s
        s_dof[s] = max(0.0, float(m.sum() - state.lev[m].sum()) - (3 if state.pi[s] > 0 else 0))
    return eff_w, target, s_dof


def moderate(state: FitState, eff_w, target, s_dof: dict, prior: tuple[float, float]) -> Prior | None:
    """Step 5: each quiet stratum's variance moderated toward the machine's prior (moderate_strata, in
    place) and the final fit again under the weights that gives (eff_w, in place)."""
    sigma2 = state.sigma2
    prior_used = moderate_strata(sigma2, s_dof, [not _is_noisy_key(k) for k in state.big], prior)
    for s in range(state.n_strata):
        m = state.s_of_run == s
        eff_w[m] = 1.0 / sigma2[s] if np.isfinite(sigma2[s]) and sigma2[s] > 0 else 1.0
    state.lu, state.theta = state.solve(eff_w, target)
    _leverages(state.X, eff_w, state.lu, state.p, state.lev)
    return prior_used


def config_variances(state: FitState, target, own_sigma2, s_dof: dict, n_configs: int):
    """Step 6: each configuration's own variance against its stratum's as measured here (a prior from
    the probe moves the level of the whole stratum, not how its configurations differ from each
    other): the excess of a run is then own-moderated / own-stratum, times the stratum's moderated
    weight. _own_variances' (noise source per run, excess per run, priors per stratum)."""
    base = np.where(np.isfinite(own_sigma2) & (own_sigma2 > 0), own_sigma2, state.sigma2)
    return _own_variances(target - state.X @ state.theta, state.ci, state.s_of_run, state.lev, base, s_dof,
                          n_configs, state.big)


def stratum_objects(state: FitState, own_sigma2, own_dof: dict, s_dof: dict, config_priors: dict) -> dict:
    """Step 7: stratum key -> its Stratum (merged keys share their stratum's; a noisy configuration's
    own under its own key)."""
    sigma2, distinct, home, big = state.sigma2, state.distinct, state.home, state.big
    strata = {}
    objs = []
    for s, k in enumerate(big):
        members = tuple(d for d in distinct if home[d] == k)
        objs.append(Stratum(k, int((state.s_of_run == s).sum()),
                            float(sigma2[s]) if np.isfinite(sigma2[s]) else float("nan"),
                            s_dof[s], float(state.pi[s]), float(state.delta[s]), members,
                            own_sigma2=float(own_sigma2[s]), own_dof=float(own_dof[s]),
                            config_prior=config_priors.get(s)))
    for d in distinct:
        strata[d] = objs[big.index(home[d])]
    for s, k in enumerate(big):
        strata.setdefault(k, objs[s])  # the noisy configurations' own
    return strata


NOISY_ALPHA = 0.01  # family-wise, over the configurations tested
NOISY_MIN_DOF = 1.5  # a configuration split off as noisy needs this many degrees of freedom of its own (3 runs)
NOISY_MIN_RATIO = 4.0  # before the slow modes: a noisy configuration's (trimmed) variance is at least 4x its stratum's


def _same_matrix(a, b) -> bool:
    """Are two CSR matrices the same entries in the same order (so every product with them is the same)?"""
    return (a.shape == b.shape and a.nnz == b.nnz and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


def _runs_of(ci, n_configs: int, configs=None) -> list[np.ndarray]:
    """Each configuration's runs (indices, in run order: what the mask ci == c selects), from one
    stable sort rather than a scan of every run per configuration; of `configs` only, where given."""
    order = np.argsort(ci, kind="stable")
    bounds = np.searchsorted(ci[order], np.arange(n_configs + 1))
    return [order[bounds[c]:bounds[c + 1]] for c in (range(n_configs) if configs is None else configs)]


def _robust_weights(y, ci, n_configs: int) -> np.ndarray:
    """Per run: 1 / its configuration's own variance of y, never above 1 / the median one's."""
    var = np.full(n_configs, np.nan)
    several = np.flatnonzero(np.bincount(ci, minlength=n_configs) >= 2).tolist()  # (one run: no variance)
    for c, runs in zip(several, _runs_of(ci, n_configs, several)):
        var[c] = float(np.var(y[runs], ddof=1))
    ok = np.isfinite(var) & (var > 0)
    floor = float(np.median(var[ok])) if ok.any() else 1.0
    v = np.where(ok, np.maximum(var, floor), floor)
    return 1.0 / v[ci]


OWN_VARIANCE_MIN_DOF = 0.5  # a configuration's residual degrees of freedom below this say nothing of its spread
MODERATE_MIN_CONFIGS = 3  # configurations a stratum needs before the spread of their variances is read
SPREAD_Z = 1.645  # one-sided 5%: how far beyond sampling the spread of variances must be to be read as real


def _is_noisy_key(key) -> bool:
    """Is this stratum key a noisy configuration's own (fit()'s split_noisy)?"""
    return isinstance(key, tuple) and key[:1] == ("noisy configuration",)


def _own_variances(r, ci, s_of_run, lev, sigma2, s_dof: dict, n_configs: int, keys: list):
    """Each configuration's variance moderated toward its stratum's (empirical Bayes, as limma's
    moderated t: Smyth 2004). Per stratum, the configurations' own fast-mode residual variances s_c^2
    (d_c degrees of freedom, leverages subtracted) are read as draws of s0^2 chi2_d0 / d0-distributed
    true variances; d0 and s0^2 are estimated from their spread (smyth_prior). Where that spread is
    what sampling alone gives (d0 infinite) every configuration keeps the stratum's variance and
    degrees of freedom, as under one shared variance. Otherwise a configuration's variance is
    (d0 s0^2 + d_c s_c^2) / (d0 + d_c), known with d0 + d_c degrees of freedom: a configuration
    noisier than the rest widens its own intervals as far as its runs and its neighbours say,
    and none is split off or left alone by a yes/no test (the uncorrected F test before this
    widened 3-run comparisons of a quiet machine by chance). The estimates do not change, only the
    intervals: (noise source per run, excess per run = moderated / stratum variance, the priors
    per stratum as {stratum: (d0, s0^2)}); s_dof gains an entry per configuration given its own."""
    source, excess = s_of_run.copy(), np.ones(len(r))
    runs = np.bincount(ci, minlength=n_configs)
    rss = np.bincount(ci, weights=r * r, minlength=n_configs)
    dof = runs - np.bincount(ci, weights=lev, minlength=n_configs)
    stratum = np.full(n_configs, -1)
    stratum[ci] = s_of_run  # a configuration's runs share one stratum
    runs_of = None
    priors = {}
    for s in sorted(set(stratum[stratum >= 0].tolist())):
        if _is_noisy_key(keys[s]) or not (np.isfinite(sigma2[s]) and sigma2[s] > 0 and s_dof.get(s, 0) > 0):
            continue
        mine = np.nonzero((stratum == s) & (dof >= OWN_VARIANCE_MIN_DOF) & (rss > 0))[0]
        if len(mine) < MODERATE_MIN_CONFIGS:
            continue
        d0, s0 = smyth_prior(rss[mine] / dof[mine], dof[mine])
        priors[s] = (d0, s0)
        if not math.isfinite(d0):
            continue
        if runs_of is None:
            runs_of = _runs_of(ci, n_configs)
        for c in np.nonzero(stratum == s)[0].tolist():
            d_c = float(max(dof[c], 0.0))
            own = float(rss[c]) / d_c if d_c > 0 else s0
            moderated = (d0 * s0 + d_c * own) / (d0 + d_c)
            new = len(s_dof)
            s_dof[new] = d0 + d_c
            source[runs_of[c]] = new
            excess[runs_of[c]] = moderated / float(sigma2[s])
    return source, excess, priors


def _noisy_configs(r, ci, s_of_run, lev, n_configs: int, *, trim: float = 0.2, trim_rest: bool = False,
                   centre: bool = False, min_ratio: float = 1.0) -> list[int]:
    """Configurations whose residual variance is far above their stratum's (F test, Bonferroni).

    A few slow runs (a heavy tail, a slow mode) are not a noisy configuration: from 5 runs on, a
    configuration's largest `trim` share of residuals is left out of its own variance. With
    trim_rest, the yardstick (the rest of its stratum) is trimmed the same way, configuration by
    configuration: before any slow mode is fitted, the stratum's few slow runs (6% of runs 20-100%
    slower) inflate an untrimmed yardstick as much as a noisy level's own spread, and the noisy level
    would share the quiet runs' variance (its interval then missed its truth). Trimmed alike, the
    ratio of the two variances keeps its meaning under one normal. With centre, each configuration's
    residuals are taken about their own median first: in a fit by means, a configuration with three
    slow runs of twelve has its nine others pushed below its mean, and trimming alone would then
    mistake that shift for spread. min_ratio: the least variance ratio called noisy, however many
    runs make a smaller one significant (a trimmed, centred variance of 300 runs is not biased the
    way one of 11 is, and a baseline run in every block must not be split off for that)."""
    from scipy.special import fdtrc

    own_rss, own_dof = np.zeros(n_configs), np.zeros(n_configs)
    rest_rss, rest_dof = np.zeros(n_configs), np.zeros(n_configs)
    stratum_of_config = np.full(n_configs, -1)
    runs = np.bincount(ci, minlength=n_configs)
    # A configuration of one run (a grid's are all of one), all at once: what the loop below gives it,
    # untrimmed and uncentred, its residual squared with one less its leverage degrees of freedom.
    alone = np.flatnonzero(runs[ci] == 1)  # the runs alone in their configuration
    c1, r1 = ci[alone], r[alone]
    own_rss[c1] = rest_rss[c1] = r1 * r1
    own_dof[c1] = rest_dof[c1] = 1 - lev[alone]
    stratum_of_config[c1] = s_of_run[alone]
    several = np.flatnonzero(runs >= 2).tolist()
    for c, m in zip(several, _runs_of(ci, n_configs, several)):  # its runs in run order, as ci == c gives them
        dof_c = float(len(m) - lev[m].sum())
        rm = r[m]
        rc = np.sort(np.abs(rm - (np.median(rm) if centre and len(m) >= 5 else 0.0)))
        cut = int(len(rc) * trim) if len(rc) >= 5 else 0
        kept = rc[:len(rc) - cut]
        own_rss[c], own_dof[c] = float(kept @ kept), dof_c * len(kept) / len(rc)
        rest_rss[c], rest_dof[c] = (own_rss[c], own_dof[c]) if trim_rest else (float(rm @ rm), dof_c)
        stratum_of_config[c] = int(s_of_run[m[0]])
    tested = []
    for s in set(stratum_of_config[stratum_of_config >= 0].tolist()):
        mine = stratum_of_config == s
        rss_s, dof_s = float(rest_rss[mine].sum()), float(rest_dof[mine].sum())
        # (two runs: a variance of one degree of freedom would starve its comparisons)
        for c in np.nonzero(mine & ~(own_dof < NOISY_MIN_DOF))[0].tolist():
            # against the rest of its stratum (leave it out: a noisy value must not set its own yardstick)
            dof_rest, rss_rest = dof_s - rest_dof[c], rss_s - rest_rss[c]
            if dof_rest < 0.9 or rss_rest <= 0:
                continue
            tested.append((c, (own_rss[c] / own_dof[c]) / (rss_rest / dof_rest), own_dof[c], dof_rest))
    return [c for c, f, d1, d2 in tested if f >= min_ratio and fdtrc(d1, d2, f) < NOISY_ALPHA / max(1, len(tested))]


# Parameters up to which the normal equations are factored dense (LAPACK Cholesky) rather than by
# SuperLU, and a contrast's solve is a few columns of the dense inverse (solve_few). The numbers differ
# from SuperLU's in their last digits only: on the 7 reference databases and 100k runs every number of
# the page within 2e-11 (relative), summary.md and results.csv byte for byte the same, the PNGs apart in
# a few anti-aliased pixels (1/255 where decoded: benchmarks/report_same.py --rel); tests/test_step_model.py holds
# the two paths to 1e-9. It is the faster path at a million runs (docs/measurements.md).
DENSE_SOLVE_MAX = DENSE_LEVERAGE_MAX
DENSE_MIN_PIVOT = 1e-8  # a dense factor whose smallest pivot is below this share of the largest is left to SuperLU


class _Factor:
    """The factored normal equations A = X'WX (+ a 1e-12 ridge) of one weighted fit: solve(b) for a
    vector or the columns of a matrix, inverse() (dense, computed once). Up to DENSE_SOLVE_MAX
    parameters a dense Cholesky factor (LAPACK): the design has at most two ones per run
    (configuration, block), so A is a p x p matrix of at most a few thousand rows, and where every
    configuration ran in every block (a sweep's passes) it is nearly dense, which a sparse LU fills in
    at many times the cost. Beyond that, or where A is too ill-conditioned to trust a Cholesky factor
    (a design left without a reference in some part), SuperLU as before."""

    def __init__(self, A):
        import scipy.linalg as la

        self._inv = None
        self._cho = None
        self._lu = None
        p = A.shape[0]
        if 0 < p <= DENSE_SOLVE_MAX:
            try:
                c = la.cho_factor(A.toarray(), lower=False, check_finite=False)
                d = np.abs(np.diag(c[0]))
                if d.min() ** 2 >= DENSE_MIN_PIVOT * float(A.diagonal().max()):
                    self._cho = c
            except la.LinAlgError:
                pass
        if self._cho is None:
            self._lu = splu(A.tocsc())
            self._A = A  # SuperLU's factor cannot be pickled: its matrix travels instead (__getstate__)

    def __getstate__(self) -> dict:
        """A fit made in a child (effects.analyse) comes back pickled: a SuperLU factor as its matrix,
        factored again where it lands (the same factor: SuperLU is deterministic)."""
        return {k: v for k, v in self.__dict__.items() if k != "_lu"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lu = splu(self._A.tocsc()) if "_A" in state else None

    def solve(self, b):
        if self._cho is None:
            return self._lu.solve(b)
        import scipy.linalg as la

        return la.cho_solve(self._cho, b, check_finite=False)

    def solve_few(self, b):
        """solve(b) for a vector b of few non-zeros (a contrast's coefficients): once the dense inverse
        is there (the leverages computed it), the columns of A^-1 of b's non-zeros, O(p) per non-zero
        rather than two triangular solves of O(p^2)."""
        if self._inv is None or self._cho is None:  # SuperLU: its own solve, float for float as before
            return self.solve(b)
        nz = np.flatnonzero(b)
        return self._inv[:, nz] @ b[nz]

    def inverse(self) -> np.ndarray:
        if self._inv is None:
            if self._cho is None:
                self._inv = self._lu.solve(np.eye(self._lu.shape[0]))
            else:
                from scipy.linalg import lapack

                inv, info = lapack.dpotri(self._cho[0], lower=0)
                if info != 0:
                    raise np.linalg.LinAlgError(f"dpotri: {info}")
                self._inv = np.triu(inv) + np.triu(inv, 1).T
        return self._inv


def _factor(X, weights) -> _Factor:
    A = (X.T @ sparse.diags(weights) @ X).tocsc()
    return _Factor(A + sparse.identity(A.shape[0], format="csc") * 1e-12
                   * max(1.0, float(A.diagonal().max(initial=1.0))))


def _solve(X, weights):
    """A weighted least-squares solver for design X: target -> (factor, theta)."""
    f = _factor(X, weights)
    return lambda target: (f, f.solve(X.T @ (weights * target)))


def _leverages(X, weights, lu, p: int, out: np.ndarray) -> None:
    """h_i = w_i x_i' A^-1 x_i, exact up to DENSE_LEVERAGE_MAX parameters (A^-1 dense, each x_i's few
    entries gathered from it), else p / n each."""
    n = X.shape[0]
    if p > DENSE_LEVERAGE_MAX or n == 0:
        out[:] = p / max(n, 1)
        return
    inv = lu.inverse()
    X = X.tocsr()
    counts = np.diff(X.indptr)
    width = int(counts.max(initial=0))
    h = np.zeros(n)
    for k in range(width):  # each row's k-th entry against every entry of the row
        rows = np.nonzero(counts > k)[0]
        ck = X.indices[X.indptr[rows] + k]
        vk = X.data[X.indptr[rows] + k]
        for j in range(width):
            both = counts[rows] > j
            r2 = rows[both]
            cj = X.indices[X.indptr[r2] + j]
            vj = X.data[X.indptr[r2] + j]
            h[r2] += vk[both] * vj * inv[ck[both], cj]  # r2 holds each row once
    out[:] = weights * h


def _mixture(X, y, m, theta, lev, sigma2, weights, solver=None):
    """A slow mode among the runs m, from the best of a few EM starts (the slowest 10-40% as the
    first guess of the slow mode): (theta, posterior, pi, delta, sigma2), or None where
    one normal explains the residuals as well (BIC) or the modes are not separated."""
    r0 = (y - X @ theta)[m]
    u0 = r0 / np.sqrt(np.clip(1 - lev[m], 0.05, 1.0))
    if not _two_modes(u0):
        return None
    best = None
    solver = solver or _solve(X, weights)  # the weights stay: one factor for every start and iteration
    for share in (0.1, 0.2, 0.3, 0.4):
        got = _em(X, y, m, theta, lev, weights, u0 > np.quantile(u0, 1 - share), solver)
        if got is not None and (best is None or got[-1] > best[-1]):
            best = got
    if best is None:
        return None
    theta_m, post, pi, delta, s2, ll_mix = best
    if not (MIX_MIN_SHARE <= pi <= MIX_MAX_SHARE and delta >= MIX_SEPARATION * math.sqrt(s2)):
        return None
    # which mode a run is in is itself uncertain: that uncertainty is noise in the fast-mode estimates
    s2 += delta * delta * float(np.mean(post[m] * (1 - post[m])))
    return theta_m, post, pi, delta, s2


def _two_modes(u: np.ndarray) -> bool:
    """Do these standardized residuals hold a slow mode? A two-component normal mixture (one shared
    variance, EM from a few starts) against one normal, by BIC (2 more parameters), with the modes
    at least MIX_SEPARATION sigmas apart and the slow one's share within [MIX_MIN_SHARE, MIX_MAX_SHARE]."""
    n = len(u)
    v0 = float(np.var(u))
    if n < MIX_MIN_RUNS or v0 <= 0:
        return False
    ll_one = -0.5 * n * (math.log(2 * math.pi * v0) + 1)
    best = _two_modes_best(u)
    if best is None:
        return False
    ll, pi, gap, s2 = best
    return (2 * (ll - ll_one) > 2 * math.log(n) + 6 and MIX_MIN_SHARE <= pi <= MIX_MAX_SHARE
            and gap >= MIX_SEPARATION * math.sqrt(s2))


def _two_modes_best(u: np.ndarray):
    """_two_modes' EM: the (log-likelihood, pi, gap, s2) of its best start, None where none fitted."""
    n = len(u)
    best = None
    # Each EM iteration is the plain one, float for float (pi = clip(mean(w)), m0 = sum((1 - w) u) /
    # sum(1 - w), m1, s2 = sum((1 - w) (u - m0)^2 + w (u - m1)^2) / n, the log densities, the new
    # w = 1 / (1 + exp(clip(lf - ls)))): every element the same float (the same ufuncs of the same
    # operands, but for the log densities' one noted below), every sum numpy's over the same whole
    # array. At half a million runs it is 4 starts x 200 iterations of ~30 passes: each writes into a
    # buffer of its own, allocated once (a fresh array per pass, as the plain expressions make, cost
    # more than the arithmetic).
    w, w1, d0, d1, lf, ls, new, t = (np.empty(n) for _ in range(8))
    for share in (0.1, 0.2, 0.3, 0.4):
        np.greater(u, np.quantile(u, 1 - share), out=w)  # 1.0 / 0.0
        for _ in range(200):
            sw = float(w.sum())
            pi = min(max(sw / n, 1e-3), 1 - 1e-3)
            np.subtract(1, w, out=w1)
            m0 = float(np.multiply(w1, u, out=t).sum() / max(1e-9, float(w1.sum())))
            m1 = float(np.multiply(w, u, out=t).sum() / max(1e-9, sw))
            np.square(np.subtract(u, m0, out=d0), out=d0)
            np.square(np.subtract(u, m1, out=d1), out=d1)
            np.multiply(w1, d0, out=t)
            s2 = float(np.add(t, np.multiply(w, d1, out=lf), out=t).sum() / n)
            if s2 <= 1e-12:
                break
            # (0.5 d) / s2 as d / (2 s2): halving and doubling are exact, so both are the one rounding of
            # d / (2 s2) (a d so small that halving it rounds is far below an ulp of log(1 - pi) and log(pi))
            np.subtract(np.log(1 - pi), np.divide(d0, 2 * s2, out=lf), out=lf)
            np.subtract(np.log(pi), np.divide(d1, 2 * s2, out=ls), out=ls)
            np.clip(np.subtract(lf, ls, out=t), -50, 50, out=t)  # min(max(t, -50), 50), in one pass
            np.divide(1.0, np.add(1.0, np.exp(t, out=t), out=t), out=new)
            done = np.max(np.abs(np.subtract(new, w, out=t), out=t)) < 1e-7
            w, new = new, w
            if done:
                break
        if s2 <= 1e-12:
            continue
        ll = float(np.sum(np.logaddexp(lf, ls)) - 0.5 * n * math.log(2 * math.pi * s2))
        if best is None or ll > best[0]:
            best = (ll, pi, m1 - m0, s2)
    return best


def _em(X, y, m, theta, lev, weights, slow0, solver=None):
    """EM from one start (the runs slow0 of m in the slow mode): a latent shift delta on a share pi
    of the runs, one variance for both modes, theta refitted to the targets with each run's expected
    shift removed. The variance divides by the residual degrees of freedom, not by n: with nearly a
    parameter per two runs the ML variance would be half the truth and the modes would collapse."""
    solver = solver or _solve(X, weights)
    post_m = slow0.astype(float)
    n_s = len(post_m)
    if post_m.sum() < 2 or post_m.sum() > n_s - 2:
        return None
    dof = max(1.0, n_s - float(lev[m].sum()) - 2)
    r = (y - X @ theta)[m]
    delta = float(np.mean(r[post_m > 0]) - np.mean(r[post_m == 0])) / max(0.2, 1 - float(lev[m].mean()))
    for _ in range(EM_ITERATIONS):
        pi = float(np.clip(post_m.mean(), 1e-3, 1 - 1e-3))
        target = y.copy()
        target[m] = y[m] - delta * post_m
        _, theta = solver(target)
        r = (y - X @ theta)[m]  # fast-mode residual; the slow mode's is r - delta
        delta = float(np.sum(post_m * r) / max(1e-9, post_m.sum()))
        s2 = float(np.sum((1 - post_m) * r * r + post_m * (r - delta) ** 2) / dof)
        if delta <= 0 or s2 <= 0:
            return None
        lf = np.log(1 - pi) - 0.5 * r * r / s2
        ls = np.log(pi) - 0.5 * (r - delta) ** 2 / s2
        new = 1.0 / (1.0 + np.exp(np.clip(lf - ls, -50, 50)))
        done = np.max(np.abs(new - post_m)) < 1e-6
        post_m = new
        if done:
            break
    pi = float(np.clip(post_m.mean(), 1e-3, 1 - 1e-3))
    ll = float(np.sum(np.logaddexp(np.log(1 - pi) - 0.5 * r * r / s2, np.log(pi) - 0.5 * (r - delta) ** 2 / s2))
               - 0.5 * n_s * np.log(2 * np.pi * s2))
    post = np.zeros(len(y))
    post[m] = post_m
    return theta, post, pi, delta, s2, ll


def smyth_prior(s2, dof) -> tuple[float, float]:
    """(d0, s0^2): the prior degrees of freedom and variance of a set of sample variances s2 with
    degrees of freedom dof, by Smyth's (2004) moments of log s2: e = log s2 - digamma(d/2) +
    log(d/2) has mean log s0^2 - digamma(d0/2) + log(d0/2) and variance trigamma(d/2) +
    trigamma(d0/2). d0 is infinite (s0^2 the mean of e back-transformed) where the spread is no
    more than sampling gives."""
    from scipy.special import digamma, polygamma

    s2, dof = np.asarray(s2, dtype=float), np.asarray(dof, dtype=float)
    e = np.log(s2) - digamma(dof / 2) + np.log(dof / 2)
    e_mean = float(e.mean())
    if len(e) < 2:
        return math.inf, math.exp(e_mean)
    excess = float(np.var(e, ddof=1)) - float(np.mean(polygamma(1, dof / 2)))
    # Sampling alone makes that excess positive in half the sweeps of a machine whose configurations are
    # equally noisy (and with 1-2 degrees of freedom each, by a lot: log chi2_1 is heavy-tailed): a prior
    # of finite d0 is taken only where the excess is beyond what sampling gives in one sweep in twenty
    # (its standard error under equal variances: the fourth cumulant of log chi2_d / d is
    # tetragamma'(d/2), so Var(sample variance) ~ (psi3 + 2 psi1^2) / G).
    null_se = math.sqrt(float(np.mean(polygamma(3, dof / 2) + 2 * polygamma(1, dof / 2) ** 2)) / len(e))
    if excess <= SPREAD_Z * null_se:
        return math.inf, math.exp(e_mean)
    d0 = 2 * trigamma_inverse(excess)
    return d0, math.exp(e_mean + float(digamma(d0 / 2)) - math.log(d0 / 2))


def trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Smyth's Newton iteration, as limma's trigammaInverse)."""
    from scipy.special import polygamma

    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        dif = tri * (1 - tri / x) / float(polygamma(2, y))
        y += dif
        if -dif / y < 1e-8:
            break
    return y


def prior_dof(sampling_dof: float, tau2: float) -> float:
    """The degrees of freedom a variance measured with sampling_dof is worth as the prior of another
    occasion's, where log variance moves by tau2 (its variance) between occasions: the d0 whose
    trigamma(d0 / 2) is trigamma(sampling_dof / 2) + tau2 (the variance of a log chi2 / d is
    trigamma(d / 2))."""
    from scipy.special import polygamma

    return 2 * trigamma_inverse(float(polygamma(1, sampling_dof / 2)) + tau2)


# How far a machine's noise moves between occasions, as the variance of log residual variance: the
# quick sweeps of one VM at different hours had residuals of 9.8%, 10.8% and 4.8% (docs/measurements.md,
# machine E; about 96 degrees of freedom each, so sampling explains almost none of it), a variance of
# log variance of 0.78. A figure measured at another time (the probe's) is never trusted further than
# that, however well the sweep at hand happens to agree with it.
TAU2_MIN = 0.75
BLOCK_MIN_DOF = MIN_STRATUM_DF  # residual degrees of freedom a design must keep after paying for its blocks


@dataclass
class Prior:
    """What the machine is known to do, as a prior of a sweep's residual variance (moderate_strata)."""

    sigma2: float  # its log-scale variance (the probe's CV, as a variance of log step time)
    sampling_dof: float  # the degrees of freedom it was measured with (the probe's runs less one)
    tau2: float  # the variance of log variance between occasions used (at least TAU2_MIN)
    tau2_estimated: float | None  # what this machine's figures said of it (None: too few to say)
    dof: float  # d0: the degrees of freedom the prior is worth here
    refused: int = 0  # strata whose own variance the prior disagrees with (PRIOR_ALPHA): they borrowed nothing

    @property
    def cv(self) -> float:
        return math.sqrt(math.expm1(self.sigma2))


def moderate_strata(sigma2: np.ndarray, s_dof: dict, quiet: list[bool], prior: tuple[float, float]) -> Prior | None:
    """Each quiet stratum's variance moderated toward the machine's prior (in place: sigma2 and s_dof):
    (d0 prior + d s^2) / (d0 + d) with d0 + d degrees of freedom, limma's moderated variance with one
    prior. d0 is what a variance measured with the prior's own degrees of freedom is worth on
    another occasion (prior_dof): tau2, the variance of log variance between occasions, is estimated
    from the spread of the prior and the strata's variances (Smyth's moments) and never taken below
    TAU2_MIN. A stratum with no degrees of freedom of its own (nothing repeated, or every repeat
    disturbed) gets the prior's variance with its d0 degrees of freedom. Strata of a noisy
    configuration of its own are left as they are. None where the prior is unusable."""
    from scipy.special import digamma, polygamma

    p_s2, p_dof = prior
    if not (p_s2 and math.isfinite(p_s2) and p_s2 > 0 and p_dof and p_dof > 0):
        return None
    own = [(float(sigma2[s]), float(s_dof[s])) for s in range(len(sigma2))
           if quiet[s] and s_dof[s] >= OWN_VARIANCE_MIN_DOF and np.isfinite(sigma2[s]) and sigma2[s] > 0]
    tau2_hat = None
    if own:
        v = np.array([p_s2] + [a for a, _ in own])
        d = np.array([p_dof] + [b for _, b in own])
        e = np.log(v) - digamma(d / 2) + np.log(d / 2)
        tau2_hat = max(0.0, float(np.var(e, ddof=1)) - float(np.mean(polygamma(1, d / 2))))
    tau2 = max(TAU2_MIN, tau2_hat or 0.0)
    d0 = prior_dof(p_dof, tau2)
    refused = 0
    for s in range(len(sigma2)):
        if not quiet[s]:
            continue
        d_s = float(s_dof[s]) if np.isfinite(sigma2[s]) and sigma2[s] > 0 else 0.0
        mine = float(sigma2[s]) if d_s > 0 else 0.0
        if d_s > 0 and _disagrees(mine, d_s, p_s2, p_dof):
            refused += 1  # a probe taken under other load is not this sweep's noise: its own variance stands
            continue
        sigma2[s] = (d0 * p_s2 + d_s * mine) / (d0 + d_s)
        s_dof[s] = d0 + d_s
    return Prior(float(p_s2), float(p_dof), tau2, tau2_hat, d0, refused)


PRIOR_ALPHA = 0.05  # a stratum whose variance and the prior's differ at this level (two-sided F) borrows nothing


def _disagrees(s2: float, dof: float, p_s2: float, p_dof: float) -> bool:
    """Whether a stratum's own variance (s2, dof) and the prior's (p_s2, p_dof) are too far apart to be
    one noise: a two-sided F test at PRIOR_ALPHA. Borrowing from a prior the data reject would move a
    quiet sweep's variance up to a busy probe's (a variance 30x the sweep's, at even one degree of
    freedom, triples it), or a noisy sweep's down."""
    from scipy.special import fdtri  # F's quantile, as scipy.stats.f.ppf computes it

    ratio = s2 / p_s2
    return bool(ratio < fdtri(dof, p_dof, PRIOR_ALPHA / 2) or ratio > fdtri(dof, p_dof, 1 - PRIOR_ALPHA / 2))


def _blocks_cost_too_much(ci, bi, n_configs: int, n_blocks: int) -> bool:
    """Whether block effects would leave the design fewer than BLOCK_MIN_DOF residual degrees of
    freedom where leaving them out keeps more (a small grid of two passes: each block is a whole
    pass, and its one degree of freedom is a fifth of what the sweep has). There the configurations'
    effects are fitted on their own: a pass's drift is then part of the residual, which is what it
    costs, but the comparisons are not starved."""
    if n_blocks < 2 or len(ci) == 0:
        return False
    n = len(ci)
    configs = len(np.unique(ci))
    graph = sparse.coo_matrix((np.ones(n), (ci, n_configs + bi)), shape=(n_configs + n_blocks,) * 2)
    n_parts, labels = connected_components(graph, directed=False)
    used_blocks = len(np.unique(bi))
    parts = len(np.unique(labels[n_configs + np.unique(bi)]))
    with_blocks = n - configs - (used_blocks - parts)
    return with_blocks < BLOCK_MIN_DOF and with_blocks < n - configs
