-- cpubench schema: the single source of truth for the results database.
-- Written in SQLite's dialect; orchestrator/queue/store.py adapts the few differences for PostgreSQL
-- (AUTOINCREMENT keys, REAL -> DOUBLE PRECISION). Users query v_results.
--
-- Decisions:
-- * Times are REAL seconds since the epoch taken from the database's own clock, so heartbeats
--   from several hosts compare on one clock.
-- * jobs is the plan and never changes after enqueue; runs holds what happened, one row per
--   (job, machine). A job with no run row for a machine is queued for that machine.
-- * A run taken back from a dead worker keeps its row as 'queued' so its attempt count survives;
--   the claim treats it exactly like a job without a row.
-- * The variable columns of jobs are named and ordered as orchestrator/variables.py's catalogue
--   (tests/test_schema.py keeps them in step). The word "default" (leave the machine as it is)
--   is stored as NULL in freq_mhz; every other variable column is concrete.
-- * "window" is a keyword in PostgreSQL: quote it there ("window").

CREATE TABLE IF NOT EXISTS machines (
    machine_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint       TEXT NOT NULL UNIQUE,   -- sha256 of the facts that identify the hardware
    hostname          TEXT,
    cpu_model         TEXT,
    vendor            TEXT,
    sockets           INTEGER,
    physical_cores    INTEGER,
    logical_cores     INTEGER,
    numa_nodes        INTEGER,
    smt               BOOLEAN,
    isa_flags         TEXT,                   -- space-separated subset: avx2 avx512f ... amx_tile
    l1d_kb            INTEGER,
    l2_kb             INTEGER,
    l3_kb             INTEGER,
    mem_total_gb      REAL,
    mem_bw_gbs_1t     REAL,                   -- measured triad bandwidth, one thread
    mem_bw_gbs_all    REAL,                   -- measured triad bandwidth, all CPUs
    gemm_gflops_fp32_1c  REAL,                -- measured GEMM peak, one core
    gemm_gflops_fp32_all REAL,
    gemm_gflops_bf16_1c  REAL,
    gemm_gflops_bf16_all REAL,
    freq_driver       TEXT,                   -- intel_pstate, acpi-cpufreq, amd-pstate... or NULL
    freq_min_mhz      INTEGER,
    freq_max_mhz      INTEGER,
    kernel            TEXT,
    torch_version     TEXT,
    knobs             TEXT,                   -- JSON: knob -> null (available) or the reason why not
    facts             TEXT NOT NULL,          -- JSON: everything the probe found
    first_seen        REAL NOT NULL,
    last_seen         REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL,
    source      TEXT NOT NULL,                -- file path, "preset:NAME" or "command line"
    text        TEXT NOT NULL,                -- the sweep as it was expanded (file text + overrides)
    text_sha    TEXT NOT NULL,
    notes       TEXT,                         -- JSON list: what expansion left out on this machine, and why
    created     REAL NOT NULL,
    UNIQUE (name, text_sha)                   -- re-enqueueing the same sweep reuses its row
);

CREATE TABLE IF NOT EXISTS jobs (
    job_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    config_hash   TEXT NOT NULL UNIQUE,       -- sha256 of the canonical config JSON: enqueue is idempotent
    sweep_id      INTEGER NOT NULL REFERENCES sweeps (sweep_id),  -- the sweep that first planned it
    run_order     INTEGER NOT NULL,           -- repeat * 2^48 + seeded hash: repeat 0 of all first
    config        TEXT NOT NULL,              -- JSON of the full config
    created       REAL NOT NULL,
    -- one typed column per variable, in catalogue order
    cores         INTEGER NOT NULL,
    freq_mhz      INTEGER,
    governor      TEXT    NOT NULL,
    turbo         TEXT    NOT NULL,
    pin_threads   BOOLEAN NOT NULL,
    numa          TEXT    NOT NULL,
    allocator     TEXT    NOT NULL,
    omp_threads   INTEGER NOT NULL,
    intra_threads INTEGER NOT NULL,
    inter_threads INTEGER NOT NULL,
    isa           TEXT    NOT NULL,
    onednn        BOOLEAN NOT NULL,
    framework     TEXT    NOT NULL,
    compile       TEXT    NOT NULL,
    fusion        BOOLEAN NOT NULL,
    compile_cache TEXT    NOT NULL,
    attn_backend  TEXT    NOT NULL,
    n_layers      INTEGER NOT NULL,
    d_model       INTEGER NOT NULL,
    n_heads       INTEGER NOT NULL,
    head_dim      INTEGER NOT NULL,
    kv_heads      INTEGER NOT NULL,
    mlp_ratio     REAL    NOT NULL,
    dropout       REAL    NOT NULL,
    activation    TEXT    NOT NULL,
    attention     TEXT    NOT NULL,
    "window"      INTEGER NOT NULL,
    vocab_size    INTEGER NOT NULL,
    seq_len       INTEGER NOT NULL,
    batch_size    INTEGER NOT NULL,
    grad_accum    INTEGER NOT NULL,
    precision     TEXT    NOT NULL,
    optimizer     TEXT    NOT NULL,
    task          TEXT    NOT NULL,
    steps         INTEGER NOT NULL,
    warmup_steps  INTEGER NOT NULL,
    seed          INTEGER NOT NULL,
    dataset       TEXT    NOT NULL,
    repeat        INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS jobs_by_run_order ON jobs (run_order, job_id);

-- A job planned by several sweeps belongs to each (status per sweep), but runs once.
CREATE TABLE IF NOT EXISTS sweep_jobs (
    sweep_id  INTEGER NOT NULL REFERENCES sweeps (sweep_id),
    job_id    INTEGER NOT NULL REFERENCES jobs (job_id),
    PRIMARY KEY (sweep_id, job_id)
);

CREATE TABLE IF NOT EXISTS runs (
    run_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id        INTEGER NOT NULL REFERENCES jobs (job_id),
    machine_id    INTEGER NOT NULL REFERENCES machines (machine_id),
    status        TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'skipped')),
    attempts      INTEGER NOT NULL DEFAULT 0, -- claims so far; failed once it reaches the maximum
    worker_pid    INTEGER,
    worker_host   TEXT,
    child_pid     INTEGER,
    claimed       REAL,
    heartbeat     REAL,
    finished      REAL,
    reason        TEXT,                       -- the error (failed) or why not run (skipped)
    applied       TEXT,                       -- JSON: settings read back after applying them
    dataset_used  TEXT,                       -- the text really trained on (hub name or builtin)
    output_path   TEXT,                       -- the saved model, under output/
    torch_version TEXT,
    python_version TEXT,
    build_info    TEXT,                       -- JSON: BLAS, oneDNN, OpenMP, CPU capability
    load_before   REAL,                       -- 1-minute load average when the child started
    -- metrics: NULL when this machine cannot measure them, never a made-up number
    setup_s        REAL,                      -- child start to first step: imports, data, model
    first_step_s   REAL,                      -- the first (untimed) step, compile included
    step_ms_median REAL,
    step_ms_p10    REAL,
    step_ms_p90    REAL,
    step_ms_mean   REAL,
    step_ms_std    REAL,
    train_s        REAL,                      -- the timed steps together
    wall_s         REAL,                      -- the child's whole life, seen by the worker
    tokens_per_s   REAL,                      -- from the median step
    samples_per_s  REAL,
    loss_first     REAL,
    loss_last      REAL,
    peak_rss_mb    REAL,
    cpu_user_s     REAL,
    cpu_sys_s      REAL,
    ctx_switches   INTEGER,                   -- involuntary context switches of the child
    freq_mhz_avg   REAL,
    energy_j       REAL,
    temp_c_max     REAL,
    params         INTEGER,
    flops_per_step REAL,
    gflops         REAL,                      -- achieved, from the median step
    mfu            REAL,                      -- gflops / measured GEMM peak of the run's precision
    UNIQUE (job_id, machine_id)
);

CREATE INDEX IF NOT EXISTS runs_by_machine_status ON runs (machine_id, status);

-- One row per run: every variable, every metric, the machine facts. What users query.
CREATE VIEW IF NOT EXISTS v_results AS
SELECT
    r.run_id, r.status, r.attempts, r.reason, r.claimed, r.finished,
    s.name AS sweep,
    j.job_id, j.config_hash,
    j.cores, j.freq_mhz, j.governor, j.turbo, j.pin_threads, j.numa, j.allocator,
    j.omp_threads, j.intra_threads, j.inter_threads, j.isa, j.onednn, j.framework, j.compile,
    j.fusion, j.compile_cache, j.attn_backend, j.n_layers, j.d_model, j.n_heads, j.head_dim,
    j.kv_heads, j.mlp_ratio, j.dropout, j.activation, j.attention, j."window", j.vocab_size,
    j.seq_len, j.batch_size, j.grad_accum, j.precision, j.optimizer, j.task, j.steps,
    j.warmup_steps, j.seed, j.dataset, j.repeat,
    r.setup_s, r.first_step_s, r.step_ms_median, r.step_ms_p10, r.step_ms_p90, r.step_ms_mean,
    r.step_ms_std, r.train_s, r.wall_s, r.tokens_per_s, r.samples_per_s, r.loss_first,
    r.loss_last, r.peak_rss_mb, r.cpu_user_s, r.cpu_sys_s, r.ctx_switches, r.freq_mhz_avg,
    r.energy_j, r.temp_c_max, r.params, r.flops_per_step, r.gflops, r.mfu,
    r.dataset_used, r.output_path, r.applied, r.torch_version, r.python_version, r.load_before,
    m.machine_id, m.fingerprint, m.hostname, m.cpu_model, m.vendor, m.sockets, m.physical_cores,
    m.logical_cores, m.numa_nodes, m.smt, m.isa_flags, m.l1d_kb, m.l2_kb, m.l3_kb,
    m.mem_total_gb, m.mem_bw_gbs_1t, m.mem_bw_gbs_all, m.gemm_gflops_fp32_1c,
    m.gemm_gflops_fp32_all, m.gemm_gflops_bf16_1c, m.gemm_gflops_bf16_all, m.freq_driver,
    m.freq_min_mhz, m.freq_max_mhz, m.kernel
FROM runs r
JOIN jobs j ON j.job_id = r.job_id
JOIN sweeps s ON s.sweep_id = j.sweep_id
JOIN machines m ON m.machine_id = r.machine_id
WHERE r.status <> 'queued';

-- Fitted effects of each variable on step time (step_ms_median), written by `bench.py report`
-- (orchestrator/stats/effects.py). Decisions:
-- * Each report replaces the rows of the machines it covers: the table holds the latest fit only,
--   and a report run twice never duplicates rows.
-- * kind 'elasticity' (numeric, size-like variables): the slope of log(step time) on log(variable),
--   least squares within groups of done runs that differ only in this variable (and the variables
--   derived from it, e.g. head_dim from d_model); value is NULL. 1.0 = time proportional to it.
-- * kind 'ratio' (every variable, one row per value that is not the baseline): geometric-mean step
--   time at variable = value over that at variable = baseline, in the runs that differ from the
--   baseline configuration only in this variable. Below 1 = faster than the baseline.
-- * ci_low / ci_high: 95% t-interval (on the log scale, noise pooled across the values); NULL when
--   there are too few repeats to estimate the noise.
-- * Values are stored as text as the report prints them (on/off for booleans, "default" for NULL).
CREATE TABLE IF NOT EXISTS effects (
    effect_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  INTEGER NOT NULL REFERENCES machines (machine_id),
    variable    TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('elasticity', 'ratio')),
    value       TEXT,                       -- the value compared (ratio); NULL for elasticity
    baseline    TEXT,                       -- the value it is compared with (ratio); NULL for elasticity
    estimate    REAL NOT NULL,
    ci_low      REAL,
    ci_high     REAL,
    n_runs      INTEGER NOT NULL,           -- done runs the estimate rests on
    created     REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS effects_by_machine ON effects (machine_id, variable);
