"""step_model's numerics: the dense factor of the normal equations says what SuperLU says, the
leverages are the hat matrix's diagonal, a contrast's shortcuts give the per-cell formula's numbers,
and the vectorised helpers select what the plain masks select."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from orchestrator.stats import step_model as sm


def sweep(seed: int, *, n_configs=30, passes=10, slow=0.3, noisy=(), two_strata=True):
    """Runs of a sweep: every configuration once per pass (block = pass), a drift per pass, 1- and
    2-CPU strata (the 2-CPU one with a slow mode), some configurations far noisier."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(3.0, 0.5, n_configs)
    drift = rng.normal(0.0, 0.03, passes)
    ci, bi, keys, y, pi = [], [], [], [], []
    for q in range(passes):
        for c in rng.permutation(n_configs):
            cores = (1 if c % 3 == 0 else 2) if two_strata else 2
            e = rng.normal(0.0, 0.02 * (6 if c in noisy else 1))
            if cores == 2 and rng.random() < slow:
                e += 0.15
            ci.append(int(c)), bi.append(q), keys.append(cores), pi.append(q)
            y.append(mu[c] + drift[q] + e)
    return np.array(y), np.array(ci), np.array(bi), keys, np.array(pi), n_configs, passes


def fitted(data, **kw):
    y, ci, bi, keys, pi, nc, nb = data
    return sm.fit(y, ci, bi, keys, n_configs=nc, n_blocks=nb, pass_idx=pi, **kw)


def contrasts(n_configs):
    out = [{c: 1.0, 0: -1.0} for c in range(1, n_configs)]
    half = n_configs // 2
    out.append({c: 1.0 / half for c in range(half)} | {c: -1.0 / (n_configs - half) for c in range(half, n_configs)})
    return out


def close(a, b, rel):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert a.shape == b.shape
    scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-300)
    assert float(np.max(np.abs(a - b), initial=0.0)) <= rel * scale, (a, b)


@pytest.mark.parametrize("noisy", [(), (4, 7)])
def test_the_dense_factor_says_what_superlu_says(monkeypatch, noisy):
    data = sweep(1, noisy=noisy)
    monkeypatch.setattr(sm, "DENSE_SOLVE_MAX", 0)
    ref = fitted(data)  # every factor a SuperLU one
    monkeypatch.setattr(sm, "DENSE_SOLVE_MAX", sm.DENSE_LEVERAGE_MAX)
    dense = fitted(data)
    assert dense._solve.__self__._cho is not None  # the dense Cholesky path was taken
    assert ref._solve.__self__._cho is None
    # the slow mode was found (the EM ran with its one factor per start), and with noisy
    # configurations some have a variance of their own
    assert any(s.bimodal for s in dense.distinct_strata())
    if noisy:
        assert len(dense.distinct_strata()) > 2 or dense._extra() is not None
    close(dense.mu, ref.mu, 1e-10)
    close(dense.gamma, ref.gamma, 1e-8)
    close(dense.slow_prob, ref.slow_prob, 1e-8)
    sd, sr = dense.distinct_strata(), ref.distinct_strata()
    assert [(s.key, s.runs, s.members) for s in sd] == [(s.key, s.runs, s.members) for s in sr]
    for a, b in zip(sd, sr):
        for f in ("sigma2", "dof", "slow_share", "slow_shift"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-9, abs=1e-12)
    vecs = contrasts(data[5])
    for w in vecs:
        a, b = dense.contrast(w), ref.contrast(w)
        assert a.estimate == pytest.approx(b.estimate, rel=1e-10)
        assert a.se == pytest.approx(b.se, rel=1e-9) and a.dof == pytest.approx(b.dof, rel=1e-9)
    close(dense.covariance(vecs[:6]), ref.covariance(vecs[:6]), 1e-9)


@pytest.mark.parametrize("dense", [False, True])
def test_a_fit_sent_through_pickle_gives_every_contrast_float_for_float(monkeypatch, dense):
    """effects.analyse has a child fit a machine's model and send the Fit back: a SuperLU factor
    (which cannot be pickled) is factored again where it lands, a dense one travels as it is."""
    monkeypatch.setattr(sm, "DENSE_SOLVE_MAX", sm.DENSE_LEVERAGE_MAX if dense else 0)
    data = sweep(2, noisy=(4, 7))
    here = fitted(data)
    there = pickle.loads(pickle.dumps(here))
    assert (there._solve.__self__._cho is not None) == dense
    vecs = contrasts(data[5])
    for w in vecs:
        a, b = here.contrast(w), there.contrast(w)
        assert (a.estimate, a.se, a.dof) == (b.estimate, b.se, b.dof)
    assert np.array_equal(here.covariance(vecs[:6]), there.covariance(vecs[:6]))
    assert np.array_equal(here.mu, there.mu) and np.array_equal(here.slow_prob, there.slow_prob)


def test_leverages_are_the_hat_matrix_diagonal():
    y, ci, bi, keys, pi, nc, nb = sweep(2, n_configs=12, passes=6)
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 2.0, len(y))
    n = len(y)
    from scipy import sparse

    X = sparse.csr_matrix((np.ones(2 * n - int((bi == 0).sum())),
                           (np.concatenate([np.arange(n), np.nonzero(bi > 0)[0]]),
                            np.concatenate([ci, nc + bi[bi > 0] - 1]))), shape=(n, nc + nb - 1))
    p = X.shape[1]
    lev = np.empty(n)
    sm._leverages(X, w, sm._factor(X, w), p, lev)
    Xd = X.toarray() * np.sqrt(w)[:, None]
    hat = Xd @ np.linalg.solve(Xd.T @ Xd, Xd.T)
    close(lev, np.diag(hat), 1e-9)
    assert lev.sum() == pytest.approx(p, rel=1e-9)


def test_one_noise_source_contrast_is_the_per_cell_formula(monkeypatch):
    monkeypatch.setattr(sm, "DENSE_SOLVE_MAX", sm.DENSE_LEVERAGE_MAX)  # the shortcut is the dense path's
    data = sweep(3, two_strata=False, slow=0.0)
    f = fitted(data)
    X, wts, source, s_dof, excess = f._design
    assert len(s_dof) == 1 and f._extra() is None  # the shortcut applies

    def z_of(a):
        return np.linalg.solve((X.T @ sparse_diag(wts) @ X).toarray(), a)

    for w in contrasts(data[5])[:5]:
        a = np.zeros(X.shape[1])
        for c, v in w.items():
            a[c] = v
        z = z_of(a)
        xz2 = (X @ z) ** 2
        total = float((wts * excess) @ xz2)
        dof = total * total / (total * total / s_dof[0])
        got = f.contrast(w)
        assert got.se == pytest.approx(math.sqrt(float(a @ z)), rel=1e-9)
        assert got.dof == pytest.approx(dof, rel=1e-12)


def sparse_diag(w):
    from scipy import sparse

    return sparse.diags(w)


def test_runs_of_selects_what_the_masks_select():
    rng = np.random.default_rng(5)
    ci = rng.integers(0, 9, 500)
    ci[ci == 4] = 3  # a configuration without runs
    for c, idx in enumerate(sm._runs_of(ci, 10)):
        assert idx.tolist() == np.nonzero(ci == c)[0].tolist()


def test_two_modes_finds_a_slow_mode_and_only_one():
    rng = np.random.default_rng(7)
    n = 4000
    assert sm._two_modes(np.where(rng.random(n) < 0.2, 4.0, 0.0) + rng.standard_normal(n))
    assert not sm._two_modes(rng.standard_normal(n))
    assert not sm._two_modes(rng.standard_t(3, n))


def plain_two_modes_best(u):
    """_two_modes' EM written plainly over whole arrays (as main had it before it went span by span):
    the (ll, pi, gap, s2) of its best start."""
    n = len(u)
    best = None
    for share in (0.1, 0.2, 0.3, 0.4):
        w = (u > np.quantile(u, 1 - share)).astype(float)
        for _ in range(200):
            pi = min(max(float(w.sum()) / n, 1e-3), 1 - 1e-3)
            m0 = float(np.sum((1 - w) * u) / max(1e-9, float((1 - w).sum())))
            m1 = float(np.sum(w * u) / max(1e-9, float(w.sum())))
            s2 = float(np.sum((1 - w) * (u - m0) ** 2 + w * (u - m1) ** 2) / n)
            if s2 <= 1e-12:
                break
            lf = np.log(1 - pi) - 0.5 * (u - m0) ** 2 / s2
            ls = np.log(pi) - 0.5 * (u - m1) ** 2 / s2
            new = 1.0 / (1.0 + np.exp(np.clip(lf - ls, -50, 50)))
            done = np.max(np.abs(new - w)) < 1e-7
            w = new
            if done:
                break
        if s2 <= 1e-12:
            continue
        ll = float(np.sum(np.logaddexp(lf, ls)) - 0.5 * n * math.log(2 * math.pi * s2))
        if best is None or ll > best[0]:
            best = (ll, pi, m1 - m0, s2)
    return best


def test_two_modes_with_its_buffers_is_the_plain_em_float_for_float():
    rng = np.random.default_rng(12)
    n = 6000
    for u in (np.where(rng.random(n) < 0.2, 4.0, 0.0) + rng.standard_normal(n), rng.standard_normal(n),
              rng.standard_t(3, n), np.where(rng.random(50) < 0.3, 3.0, 0.0) + rng.standard_normal(50),
              np.where(rng.random(n) < 0.05, 2.0, 0.0) + rng.standard_normal(n)):
        assert sm._two_modes_best(u) == plain_two_modes_best(u)


def test_covariance_skips_only_slices_that_add_zero(monkeypatch):
    # seed 9: the quiet configurations' variances spread more than sampling gives, so each has its own
    # moderated variance (an excess); the two far noisier ones are strata of their own (no excess)
    data = sweep(9, noisy=(4, 7), slow=0.0, two_strata=False)
    f = fitted(data)
    extra = f._extra()
    assert extra is not None and 0 < np.count_nonzero(extra) < len(extra)  # some cells have an excess, some none
    vecs = contrasts(data[5])[:5]
    # slices of 9 cells: some hold no excess (the 20 cells of the noisy configurations' own strata), some do
    monkeypatch.setattr(sm, "COVARIANCE_CHUNK", 9 * len(vecs))
    got = f.covariance(vecs)
    # every slice, as main computed it
    X = f._design[0]
    a = np.zeros((X.shape[1], len(vecs)))
    for j, w in enumerate(vecs):
        for c, v in w.items():
            a[c, j] = v
    z = np.column_stack([f._solve(a[:, j]) for j in range(len(vecs))])
    want = a.T @ z
    Xu = f._cells()[0]
    for lo in range(0, Xu.shape[0], 9):
        xz = Xu[lo:lo + 9] @ z
        want += xz.T @ (extra[lo:lo + 9, None] * xz)
    assert np.array_equal(got, want)


def test_the_coarse_model_shares_the_fine_factor_where_it_is_the_same(monkeypatch):
    data = sweep(6, noisy=(5,))  # block = pass: the coarse model (configuration + pass) is the fine one
    factors = []
    real = sm._factor
    monkeypatch.setattr(sm, "_factor", lambda X, w: factors.append(1) or real(X, w))
    shared = fitted(data)
    n_shared = len(factors)
    monkeypatch.setattr(sm, "_same_matrix", lambda a, b: False)  # as main: the coarse model's own factors
    factors.clear()
    own = fitted(data)
    assert n_shared < len(factors)
    assert any(s.bimodal for s in own.distinct_strata())  # the slow mode's EM ran on the coarse model
    for f in ("mu", "gamma", "slow_prob"):
        assert np.array_equal(getattr(shared, f), getattr(own, f))
    assert [vars(s) for s in shared.distinct_strata()] == [vars(s) for s in own.distinct_strata()]
    for w in contrasts(data[5]):
        assert shared.contrast(w) == own.contrast(w)


def test_a_contrast_sums_its_weights_in_their_order_and_refuses_one_that_does_not_sum_to_zero():
    """Fit.contrast takes its weights as arrays: its estimate is the plain sum over the weights in their
    order, float for float, and a contrast whose weights do not sum to zero is not estimable (None)."""
    data = sweep(3, n_configs=40, passes=4)
    fit = fitted(data)
    rng = np.random.default_rng(5)
    for _ in range(20):
        cs = [int(c) for c in rng.permutation(40)[:rng.integers(2, 40)]]
        w = rng.normal(size=len(cs))
        w[-1] -= w.sum()  # sums to zero (to rounding)
        weights = dict(zip(cs, map(float, w)))
        got = fit.contrast(weights)
        assert got is not None and got.estimate == float(sum(v * fit.mu[c] for c, v in weights.items()))
    assert fit.contrast({0: 1.0, 1: -0.5}) is None



def test_the_design_keeps_one_reference_block_per_connected_part():
    """design(): configurations 0-1 ran in blocks 0-1 and 2-3 in blocks 2-3 (five runs each time), two
    parts that share nothing: each part's first block is its reference (no column), the others a
    column each. strata_of(): a stratum of too few runs of its own joins the largest."""
    cells = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 2), (3, 2), (2, 3), (3, 3)]
    ci, bi = (np.array([c[i] for c in cells for _ in range(5)]) for i in (0, 1))
    d = sm.design(ci, bi, 4, 4)
    assert not d.blocks_dropped and d.p == 6
    assert d.component.tolist() == [0, 0, 1, 1] and d.col_of_block == {1: 4, 3: 5}
    assert d.X.toarray()[::5].tolist() == [[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 1, 0],
                                           [0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0],
                                           [0, 0, 1, 0, 0, 1], [0, 0, 0, 1, 0, 1]]
    distinct, home, big, s_of_run = sm.strata_of([2] * 40 + [1] * 3, 6, 43)
    assert distinct == [2, 1] and big == [2] and home == {2: 2, 1: 2} and set(s_of_run.tolist()) == {0}


def test_the_fits_first_step_splits_off_the_configurations_far_noisier_than_the_rest():
    """noisy_at_start() alone, on one stratum of 0.02 noise where configurations 4 and 7 have 0.12:
    those two, and split_noisy() gives each a stratum of its own."""
    y, ci, bi, keys, pi, nc, nb = sweep(2, noisy=(4, 7), slow=0.0, two_strata=False, passes=12)
    fine = sm.design(ci, bi, nc, nb)
    state = sm.FitState(y, ci, fine.X, *sm.strata_of(keys, fine.p, len(y)))
    noisy = sm.noisy_at_start(state, nc)
    assert sorted(noisy) == [4, 7]
    sm.split_noisy(state, noisy)
    assert state.big == [2] + [("noisy configuration", c) for c in noisy] and state.n_strata == 3
    assert set(state.s_of_run[ci == 7].tolist()) == {state.big.index(("noisy configuration", 7))}
    sm.fit_variances(state, 3)
    assert 0.7 < state.sigma2[0] / 0.02 ** 2 < 1.4
    # 0.12^2 = 36 x 0.02^2, each from 12 runs: a chi-square of 11 degrees of freedom puts 99% within 9-80
    assert all(9 < v / 0.02 ** 2 < 80 for v in state.sigma2[1:])


def test_the_fits_steps_one_by_one_find_the_slow_mode_and_give_the_fits_numbers():
    """fit()'s steps called alone in its order on a sweep of known truth (0.02 noise; 30% of the 2-CPU
    runs 0.15 slower): the 2-CPU stratum's variance holds its slow mode until slow_modes() finds it
    (share and shift near the truth, the fast mode's variance near 0.02^2), the 1-CPU stratum has
    none, and the steps give fit()'s own numbers."""
    y, ci, bi, keys, pi, nc, nb = sweep(2, passes=12)
    fine = sm.design(ci, bi, nc, nb)
    state = sm.FitState(y, ci, fine.X, *sm.strata_of(keys, fine.p, len(y)))
    assert state.big == [2, 1]
    sm.split_noisy(state, sm.noisy_at_start(state, nc))
    sm.fit_variances(state, 3)
    assert state.sigma2[0] > 5 * 0.02 ** 2 and 0.7 < state.sigma2[1] / 0.02 ** 2 < 1.4
    coarse = sm.coarse_design(fine.X, ci, pi, nc)
    assert coarse is fine.X  # every block a whole pass: the coarse model is the fine one
    sm.slow_modes(state, coarse, True)
    assert 0.25 < state.pi[0] < 0.35 and 0.13 < state.delta[0] < 0.17 and state.pi[1] == 0
    assert 0.7 < state.sigma2[0] / 0.02 ** 2 < 1.4
    assert sm.noisy_beyond_slow_modes(state, nc) == []
    eff_w, target, s_dof = sm.final_fit(state)
    whole = sm.fit(y, ci, bi, keys, n_configs=nc, n_blocks=nb, pass_idx=pi)
    assert np.array_equal(whole.mu, state.theta[:nc]) and np.array_equal(whole.slow_prob, state.post)
    assert whole.strata[2].sigma2 == float(state.sigma2[0]) and whole.strata[2].dof == s_dof[0]
    assert np.array_equal(whole._design[1], eff_w)
