-- cpubench schema: the single source of truth for the results database.
-- Written in SQLite's dialect; orchestrator/queue/store.py adapts the few differences for PostgreSQL
-- (AUTOINCREMENT keys, REAL -> DOUBLE PRECISION). Users query v_results.
--
-- Decisions:
-- * Times are REAL seconds since the epoch taken from the database's own clock, so heartbeats
--   from several hosts compare on one clock.
-- * jobs is the plan and never changes after enqueue; runs holds what happened, one row per
--   (job, machine). A job with no run row for a machine is queued for that machine.
-- * A run taken back from a dead worker keeps its row as 'queued' so its attempt and strike counts
--   survive; the claim treats it exactly like a job without a row.
-- * attempts counts claims, strikes the claims the job itself likely ended (its child killed by a
--   signal, or its worker dead while the child ran past its predicted time): a user's kill of a
--   worker is not the job's fault. A run is failed at the maximum of strikes, or, so that a job that
--   kills its worker every time still ends, at a higher cap of claims taken back uncounted
--   (attempts - strikes); child_started says how long the child ran when its worker died.
-- * The variable columns of jobs are named and ordered as common/variables.py's catalogue
--   (tests/test_schema.py keeps them in step). The word "default" (leave the machine as it is)
--   is stored as NULL in freq_mhz; every other variable column is concrete.
-- * "window" is a keyword in PostgreSQL: quote it there ("window").
-- * This file is the latest schema. A database records its version in schema_version; an older one
--   is brought up to this file on open by orchestrator/queue/migrations.py (numbered steps, applied once,
--   in one transaction). New columns must be nullable or have a DEFAULT, so old rows stay valid; a
--   new NOT NULL column without one needs a fill in migrations.py (tests/test_migrations.py says so).
-- * Queues are per pool, not per machine: every machine has its own pool (it runs every job, so
--   machines can be compared), and `work --pool NAME` lets identical nodes share a named pool where
--   each job runs once. runs are unique per (job, pool); machine_id says which machine ran it.

-- One row per version this database has been brought to; its version is the largest. Absent in
-- databases written before versions existed (version 1).
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER PRIMARY KEY,
    applied     REAL NOT NULL,                -- database clock
    note        TEXT NOT NULL                 -- "created" or what the migration did
);

CREATE TABLE IF NOT EXISTS machines (
    machine_id        INTEGER PRIMARY KEY AUTOINCREMENT,  -- the machine that ran the run
    fingerprint       TEXT NOT NULL UNIQUE,   -- sha256 of the facts that identify the hardware
    hostname          TEXT,                 -- the host's name when it was last seen
    cpu_model         TEXT,                 -- as /proc/cpuinfo names it
    vendor            TEXT,                 -- GenuineIntel, AuthenticAMD...
    sockets           INTEGER,              -- CPU packages
    physical_cores    INTEGER,              -- cores, all sockets
    logical_cores     INTEGER,              -- CPUs the kernel shows (SMT threads included)
    numa_nodes        INTEGER,              -- memory nodes
    smt               BOOLEAN,              -- simultaneous multithreading (hyper-threads) on
    isa_flags         TEXT,                   -- space-separated subset: avx2 avx512f ... amx_tile
    l1d_kb            INTEGER,              -- one L1 data cache (cpu0's), KiB
    l2_kb             INTEGER,              -- one L2 cache (cpu0's), KiB
    l3_kb             INTEGER,              -- one L3 cache (cpu0's, shared by its cores), KiB
    mem_total_gb      REAL,                 -- memory total in GiB (2^30 bytes), despite the name
    mem_bw_gbs_1t     REAL,                   -- measured triad bandwidth, one thread
    mem_bw_gbs_all    REAL,                   -- measured triad bandwidth, all CPUs
    gemm_gflops_fp32_1c  REAL,                -- measured GEMM peak, one core
    gemm_gflops_fp32_all REAL,              -- measured fp32 GEMM peak, all CPUs
    gemm_gflops_bf16_1c  REAL,              -- measured bf16 GEMM peak, one core
    gemm_gflops_bf16_all REAL,              -- measured bf16 GEMM peak, all CPUs
    noise_cv          REAL,                   -- measured run-to-run noise: CV of identical short runs' medians
    freq_driver       TEXT,                   -- intel_pstate, acpi-cpufreq, amd-pstate... or NULL
    freq_min_mhz      INTEGER,              -- cpuinfo_min_freq, NULL without cpufreq
    freq_max_mhz      INTEGER,              -- cpuinfo_max_freq, NULL without cpufreq
    -- the kernel release (uname -r)
    kernel            TEXT,
    torch_version     TEXT,
    knobs             TEXT,                   -- JSON: knob -> null (available) or the reason why not
    facts             TEXT NOT NULL,          -- JSON: everything the probe found
    first_seen        REAL NOT NULL,
    last_seen         REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL,              -- [sweep] name, the file's stem, or --name (a command-line sweep: its axes)
    source      TEXT NOT NULL,                -- file path, "preset:NAME" or "command line"
    text        TEXT NOT NULL,                -- the sweep as it was expanded (file text + overrides)
    text_sha    TEXT NOT NULL,
    notes       TEXT,                         -- JSON list: what expansion left out on this machine, and why
    created     REAL NOT NULL,
    UNIQUE (name, text_sha)                   -- re-enqueueing the same sweep reuses its row
);

CREATE TABLE IF NOT EXISTS jobs (
    job_id        INTEGER PRIMARY KEY AUTOINCREMENT, -- the job's id: one combination of variables and repeat
    config_hash   TEXT NOT NULL UNIQUE,       -- sha256 of the canonical config JSON: enqueue is idempotent
    sweep_id      INTEGER NOT NULL REFERENCES sweeps (sweep_id),  -- the sweep that first planned it
    run_order     INTEGER NOT NULL,           -- repeat * 2^48 + (blocked) seeded hash: repeat 0 of all first
    -- The comparison the job belongs to in its repeat pass: in an ofat sweep the axis it varies (its
    -- values and a baseline of its own run next to each other, shuffled inside the block: run_order =
    -- repeat << 48 | block position << 32 | hash); NULL in grid, random and list sweeps (the whole
    -- pass is one block) and for jobs planned before blocks. Part of the job's identity (config_hash)
    -- when not NULL, so each block's baseline is its own job. The analysis' block is (repeat, block).
    block         TEXT,
    config        TEXT NOT NULL,              -- JSON of the full config
    -- JSON: the variables resolve() computed from others at enqueue, each with the word it was
    -- left on ({"cores": "all", "omp_threads": "auto", ...}; variables.derived_words). The report
    -- compares a variable with its followers at their derived values. NULL for jobs planned before
    -- it was recorded: the report then recomputes the rules (variables.DERIVATIONS) from the config.
    derived       TEXT,
    created       REAL NOT NULL,
    -- one typed column per variable, in catalogue order
    cores         INTEGER NOT NULL,
    ranks         INTEGER NOT NULL DEFAULT 1, -- data-parallel processes per machine (torch.distributed)
    nodes         INTEGER NOT NULL DEFAULT 1, -- machines of the SLURM allocation the job trains on
    interconnect  TEXT    NOT NULL DEFAULT 'default', -- tbf rate of the links between the nodes
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
    cc_flags      TEXT    NOT NULL DEFAULT 'default',
    compiler      TEXT    NOT NULL DEFAULT 'gcc',
    -- what the framework runs its GEMMs with (variables.BLAS_OF): migrated jobs get it from the catalogue
    blas          TEXT    NOT NULL,
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
    lr            REAL    NOT NULL,           -- the peak learning rate (lr=auto: the optimizer's default)
    lr_schedule   TEXT    NOT NULL DEFAULT 'constant',
    task          TEXT    NOT NULL,
    lora_rank     INTEGER NOT NULL DEFAULT 8,
    steps         INTEGER NOT NULL,
    warmup_steps  INTEGER NOT NULL,
    max_tokens    INTEGER,                    -- a learning run's token budget; NULL: a step-time run (none)
    target_loss   REAL,                       -- the validation loss a learning run trains to; NULL: none
    eval_every    INTEGER NOT NULL DEFAULT 0, -- tokens between a learning run's evaluations; 0 without max_tokens
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

-- Who shares a queue: a machine's own pool (name NULL) or a named pool (machine_id NULL).
CREATE TABLE IF NOT EXISTS pools (
    pool_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT UNIQUE,                  -- `work --pool NAME`; NULL for a machine's own pool
    machine_id  INTEGER UNIQUE REFERENCES machines (machine_id),  -- whose own pool; NULL for a named pool
    filled      REAL,                         -- when its queue rows were made (its first claim); NULL before
    created     REAL NOT NULL,
    CHECK ((name IS NULL) <> (machine_id IS NULL))
);

CREATE TABLE IF NOT EXISTS runs (
    run_id        INTEGER PRIMARY KEY AUTOINCREMENT, -- the run's id (one per job and pool)
    job_id        INTEGER NOT NULL REFERENCES jobs (job_id),
    machine_id    INTEGER NOT NULL REFERENCES machines (machine_id),  -- the machine that ran it (last claimed it)
    pool_id       INTEGER NOT NULL REFERENCES pools (pool_id),        -- the queue it was claimed from
    status        TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'skipped')), -- running, done, failed or skipped (queued: taken back, not in v_results)
    attempts      INTEGER NOT NULL DEFAULT 0, -- claims so far (a user's SIGTERM gives its claim back); runs.strikes counts those the job itself ended
    strikes       INTEGER NOT NULL DEFAULT 0, -- claims the job itself likely ended (child killed by a signal, or past its predicted time when its worker died); failed once it reaches the maximum
    worker_pid    INTEGER,
    worker_host   TEXT,                     -- the host of the worker that claimed it
    worker_started REAL,                      -- the claiming worker's process start time: a reused pid is not it
    child_pid     INTEGER,
    child_started REAL,                       -- when this claim's child started (database clock); NULL before it did
    claimed       REAL,                     -- when a worker last claimed it (database clock)
    heartbeat     REAL,
    finished      REAL,                     -- when it ended: done, failed or skipped (database clock)
    reason        TEXT,                       -- the error (failed) or why not run (skipped)
    applied       TEXT,                       -- JSON: settings read back after applying them
    applied_read  TEXT,                       -- JSON: the keys of applied the report reads, tagged with their set (orchestrator/stats/applied_cut.py); NULL before version 11
    dataset_used  TEXT,                       -- the text really trained on: the dataset asked for, or its fallback (shakespeare, builtin)
    output_path   TEXT,                       -- the saved model, under output/
    torch_version TEXT,                     -- the torch the child imported
    python_version TEXT,                    -- the child's Python
    build_info    TEXT,                       -- JSON: BLAS, oneDNN, OpenMP, CPU capability
    gemm_format   TEXT,                       -- what the run's GEMMs compute, e.g. "q8 (simulated: fp32 GEMMs)"
    load_before   REAL,                       -- 1-minute load average when the child started
    -- metrics: NULL when this machine cannot measure them, never a made-up number
    setup_s        REAL,                      -- child start to first step: imports, data, model
    first_step_s   REAL,                      -- the first (untimed) step, compile included
    step_ms_median REAL,                    -- median time of one timed training step, ms
    step_ms_p10    REAL,                    -- 10th percentile of the timed steps, ms
    step_ms_p90    REAL,                    -- 90th percentile of the timed steps, ms
    step_ms_mean   REAL,                    -- mean of the timed steps, ms
    step_ms_std    REAL,                    -- standard deviation of the timed steps, ms
    train_s        REAL,                      -- the timed steps together
    wall_s         REAL,                      -- the child's whole life, seen by the worker
    tokens_per_s   REAL,                      -- from the median step
    samples_per_s  REAL,                    -- sequences per second, from the median step
    loss_first     REAL,                    -- training loss of the first timed step
    loss_last      REAL,                    -- training loss of the last timed step
    peak_rss_mb    REAL,                    -- the child's peak resident memory, MB
    cpu_user_s     REAL,                    -- the child's user CPU time
    cpu_sys_s      REAL,                    -- the child's system CPU time
    ctx_switches   INTEGER,                   -- involuntary context switches of the child
    freq_mhz_avg   REAL,                    -- average frequency of the job's CPUs over the timed window (cpufreq), NULL without it
    energy_j       REAL,                    -- package energy over the timed window (RAPL), NULL without it
    -- hottest CPU temperature seen in the timed window
    temp_c_max     REAL,
    params         INTEGER,                   -- every weight (tied head once), from the config
    trainable_params INTEGER,                 -- the weights the optimizer updates (= params when pretraining)
    flops_per_step REAL,                      -- analytic, from the config: the same count for every framework
    gflops         REAL,                      -- achieved, from the median step
    mfu            REAL,                      -- gflops / measured GEMM peak of the run's precision
    steal_s        REAL,                      -- CPU time the hypervisor stole during the timed window
    other_cpu_s    REAL,                      -- CPU time other processes used on the job's CPUs in the window
    world_size     INTEGER,                   -- data-parallel processes of the run (ranks x nodes)
    global_batch   INTEGER,                   -- samples per optimizer step over every rank
    allreduce_ms   REAL,                      -- median over timed steps: time some gradient bucket was in flight, sent to reduced (DDP comm hook)
    allreduce_share REAL,                     -- allreduce_ms / step_ms_median; NULL with one rank
    val_loss       REAL,                      -- mean cross-entropy over the corpus's fixed held-out tokens, after the timed steps (applied.val_tokens of them: the first 1024 in a step-time run, 8192 in a learning run)
    eval_s         REAL,                      -- the seconds that evaluation took (apart from every step time)
    train_tokens   INTEGER,                   -- tokens trained in all, warm-up included
    reached        BOOLEAN,                   -- a target_loss run: its validation loss came to the target within max_tokens; NULL without a target
    tokens_to_target INTEGER,                 -- tokens trained at the first evaluation at or below target_loss; NULL if not reached
    steps_to_target INTEGER,                  -- optimizer steps trained by then
    time_to_target_s REAL,                    -- training plus evaluation seconds by then (as MLPerf counts); NULL if not reached
    UNIQUE (job_id, pool_id)
);

CREATE INDEX IF NOT EXISTS runs_by_machine_status ON runs (machine_id, status);
CREATE INDEX IF NOT EXISTS runs_by_pool_status ON runs (pool_id, status);

-- What a pool may claim next: one row per (pool, job) without a run in that pool, or whose run was
-- taken back ('queued'). The claim reads the first row of one index in run order and deletes it, so
-- it costs O(log n) however much of the plan is done (a scan of jobs left-joined to runs did not).
-- A pool's rows are made at its first claim (pools.filled), and enqueue adds new jobs to every
-- filled pool. run_order and cores are copied from jobs (which never change) so the index alone
-- orders the claim and skips jobs wider than the worker's CPUs.
CREATE TABLE IF NOT EXISTS queue (
    pool_id     INTEGER NOT NULL REFERENCES pools (pool_id),
    job_id      INTEGER NOT NULL REFERENCES jobs (job_id),
    run_order   INTEGER NOT NULL,
    cores       INTEGER NOT NULL,
    PRIMARY KEY (pool_id, job_id)
);

CREATE INDEX IF NOT EXISTS queue_in_run_order ON queue (pool_id, run_order, job_id);

-- One row per run: every variable, every metric, the machine facts. What users query.
-- Columns computed here (the others are described where their table defines them):
--   sweep: the name of the sweep that first planned the run's job
--   pool: the queue the run was claimed from: a named pool (work --pool), or 'machine N' for machine N's own
CREATE VIEW IF NOT EXISTS v_results AS
SELECT
    r.run_id, r.status, r.attempts, r.reason, r.claimed, r.finished,
    s.name AS sweep,
    r.pool_id, COALESCE(p.name, 'machine ' || r.machine_id) AS pool, r.worker_host,
    j.job_id, j.config_hash, j.derived,
    j.cores, j.ranks, j.nodes, j.interconnect, j.freq_mhz, j.governor, j.turbo, j.pin_threads, j.numa, j.allocator,
    j.omp_threads, j.intra_threads, j.inter_threads, j.isa, j.onednn, j.framework, j.compile,
    j.fusion, j.compile_cache, j.cc_flags, j.compiler, j.blas, j.attn_backend, j.n_layers, j.d_model, j.n_heads, j.head_dim,
    j.kv_heads, j.mlp_ratio, j.dropout, j.activation, j.attention, j."window", j.vocab_size,
    j.seq_len, j.batch_size, j.grad_accum, j.precision, j.optimizer, j.lr, j.lr_schedule, j.task, j.lora_rank, j.steps,
    j.warmup_steps, j.max_tokens, j.target_loss, j.eval_every, j.seed, j.dataset, j.repeat, j.block,
    r.setup_s, r.first_step_s, r.step_ms_median, r.step_ms_p10, r.step_ms_p90, r.step_ms_mean,
    r.step_ms_std, r.train_s, r.wall_s, r.tokens_per_s, r.samples_per_s, r.loss_first,
    r.loss_last, r.peak_rss_mb, r.cpu_user_s, r.cpu_sys_s, r.ctx_switches, r.freq_mhz_avg,
    r.energy_j, r.temp_c_max, r.params, r.trainable_params, r.flops_per_step, r.gflops, r.mfu,
    r.steal_s, r.other_cpu_s, r.world_size, r.global_batch, r.allreduce_ms, r.allreduce_share,
    r.val_loss, r.eval_s, r.train_tokens, r.reached, r.tokens_to_target, r.steps_to_target, r.time_to_target_s,
    r.gemm_format, r.dataset_used, r.output_path, r.applied, r.torch_version, r.python_version, r.load_before,
    m.machine_id, m.fingerprint, m.hostname, m.cpu_model, m.vendor, m.sockets, m.physical_cores,
    m.logical_cores, m.numa_nodes, m.smt, m.isa_flags, m.l1d_kb, m.l2_kb, m.l3_kb,
    m.mem_total_gb, m.mem_bw_gbs_1t, m.mem_bw_gbs_all, m.gemm_gflops_fp32_1c,
    m.gemm_gflops_fp32_all, m.gemm_gflops_bf16_1c, m.gemm_gflops_bf16_all, m.freq_driver,
    m.freq_min_mhz, m.freq_max_mhz, m.kernel
FROM runs r
JOIN jobs j ON j.job_id = r.job_id
JOIN sweeps s ON s.sweep_id = j.sweep_id
JOIN machines m ON m.machine_id = r.machine_id
JOIN pools p ON p.pool_id = r.pool_id
WHERE r.status <> 'queued';

-- Every evaluation of a learning run (max_tokens set): how its validation loss fell with the tokens and
-- seconds it trained. Decisions:
-- * One row per (run, attempt, step): a claim that failed part way keeps the curve it had, and the
--   next claim starts clean with its own, numbered after it; v_curves says which curve is the final one.
-- * Seconds are cumulative from the first step: train_s every step's own time (warm-up included),
--   eval_s every evaluation's; train_s + eval_s is the time MLPerf counts to a quality target.
CREATE TABLE IF NOT EXISTS curves (
    run_id      INTEGER NOT NULL REFERENCES runs (run_id),  -- the run (one per job and pool)
    attempt     INTEGER NOT NULL,             -- 1, 2...: the run's claims that left a curve, in order
    step        INTEGER NOT NULL,             -- optimizer steps trained at this evaluation
    tokens      INTEGER NOT NULL,             -- tokens trained at this evaluation
    train_s     REAL NOT NULL,                -- training seconds so far
    eval_s      REAL NOT NULL,                -- evaluation seconds so far, this one included
    train_loss  REAL,                         -- mean training loss of the steps since the last evaluation
    val_loss    REAL NOT NULL,                -- mean loss over the corpus's fixed held-out windows
    PRIMARY KEY (run_id, attempt, step)
);

-- One row per evaluation, with the run's variables: what users query for learning curves.
-- Columns computed here:
--   final: the curve of the run's last attempt, and the run is done (a failed attempt's partial curve: false)
--   time_s: train_s + eval_s, the seconds to this point as a time to quality counts them
CREATE VIEW IF NOT EXISTS v_curves AS
SELECT
    c.run_id, c.attempt, (r.status = 'done' AND c.attempt = l.last_attempt) AS final, r.status, r.machine_id,
    r.dataset_used, j.job_id, j.framework, j.n_layers, j.d_model, j.n_heads, j.vocab_size, j.seq_len, j.batch_size,
    j.grad_accum, j.precision, j.optimizer, j.lr, j.lr_schedule, j.max_tokens, j.target_loss, j.eval_every,
    j.seed, j.dataset, j.repeat,
    c.step, c.tokens, c.train_s, c.eval_s, c.train_s + c.eval_s AS time_s, c.train_loss, c.val_loss
FROM curves c
JOIN runs r ON r.run_id = c.run_id
JOIN jobs j ON j.job_id = r.job_id
JOIN (SELECT run_id, MAX(attempt) AS last_attempt FROM curves GROUP BY run_id) l ON l.run_id = c.run_id;

-- Fitted effects of each variable on step time (step_ms_median), written by `bench.py report`
-- (orchestrator/stats/effects.py, whose docstring has the method). Decisions:
-- * Each report replaces the rows of the machines it covers: the table holds the latest fit only,
--   and a report run twice never duplicates rows.
-- * Runs are grouped on what ran (dataset_used, read-back settings). A comparison holds the runs that
--   differ in the variable alone, its followers (threads of cores, head_dim of d_model...) at their
--   derived values (jobs.derived).
-- * kind 'elasticity' (numeric, size-like variables): the least-squares slope of each value's mean
--   log step time on log(variable), within groups; value is NULL. 1.0 = time proportional to it.
-- * kind 'ratio' (every variable, one row per value that is not the baseline): geometric-mean step
--   time at variable = value over that at variable = baseline. Below 1 = faster than the baseline.
-- * Every run's log step time has its repeat pass's drift removed first; each value keeps its own
--   variance (Welch, Satterthwaite dof): se is on the log scale for a ratio, of the exponent for an
--   elasticity. ci_low / ci_high: this comparison's own 95% interval; ci_adj_low / ci_adj_high: the
--   simultaneous one the report shows (Bonferroni over `family` tests). p_adjusted: single-step Bonferroni
--   over every comparison of the report (p_value x family, at most 1); significant = p_adjusted < 0.05. All NULL when a value ran once.
-- * Values are stored as text as the report prints them (on/off for booleans, "default" for NULL).
CREATE TABLE IF NOT EXISTS effects (
    effect_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  INTEGER NOT NULL REFERENCES machines (machine_id),
    variable    TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('elasticity', 'ratio')),
    value       TEXT,                       -- the value compared (ratio); NULL for elasticity
    baseline    TEXT,                       -- the value it is compared with (ratio); NULL for elasticity
    estimate    REAL NOT NULL,
    ci_low      REAL,                       -- 95%, this comparison alone
    ci_high     REAL,
    n_runs      INTEGER NOT NULL,           -- done runs the estimate rests on
    created     REAL NOT NULL,
    ci_adj_low  REAL,                       -- simultaneous 95% over the report's comparisons (shown)
    ci_adj_high REAL,
    se          REAL,                       -- standard error: of log(ratio), or of the exponent
    dof         REAL,                       -- Satterthwaite degrees of freedom
    p_value     REAL,                       -- two-sided, for no change (ratio 1, exponent 0)
    p_adjusted  REAL,                       -- single-step Bonferroni, over every comparison of the report
    significant BOOLEAN,                    -- p_adjusted < 0.05; NULL when not tested
    family      INTEGER,                    -- comparisons adjusted for together
    method      TEXT,                       -- how the interval was made, in words
    min_runs    INTEGER,                    -- runs of the value with the fewest
    n_passes    INTEGER,                    -- repeat passes the runs came from
    half_width  REAL,                       -- relative half-width of the 95% interval (0.05 = +-5%;
                                            -- elasticity: of the step-time factor of a doubling)
    target_met  BOOLEAN,                    -- half_width within work --target-ci; NULL without a target
    repeats_needed INTEGER                  -- not significant: about how many runs per value would
                                            -- resolve an effect this size at the machine's noise
);

CREATE INDEX IF NOT EXISTS effects_by_machine ON effects (machine_id, variable);

-- What `work --target-ci` decided, one row per decision: a repeat pass added for the comparisons
-- whose 95% interval was wider than the target, or the end (every comparison met the target or
-- reached the maximum). The report reads the target from here.
CREATE TABLE IF NOT EXISTS adaptive_decisions (
    decision_id INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  INTEGER NOT NULL REFERENCES machines (machine_id),
    decision    TEXT NOT NULL CHECK (decision IN ('added pass', 'targets met', 'maximum reached')),
    repeat      INTEGER,                    -- the pass added (jobs.repeat of the new jobs)
    jobs        INTEGER NOT NULL,           -- new jobs enqueued (0 for the end)
    target_ci   REAL NOT NULL,              -- relative half-width asked for (0.05 = +-5%)
    max_repeats INTEGER NOT NULL,
    wide        TEXT NOT NULL,              -- JSON: the comparisons still wider than the target, with their half-widths
    created     REAL NOT NULL
);

-- A time budget (`run --budget`, `work --budget`): what one machine may spend on one sweep's runs and
-- the repeat runs the budget added. What was spent is read from the runs themselves (each one's
-- claim-to-finish time), so a stopped or killed worker resumes under the remainder.
CREATE TABLE IF NOT EXISTS budgets (
    budget_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    machine_id  INTEGER NOT NULL REFERENCES machines (machine_id),
    sweep_id    INTEGER NOT NULL REFERENCES sweeps (sweep_id),  -- the sweep whose first pass it starts from
    budget_s    REAL NOT NULL,              -- seconds of runs asked for (the latest asking)
    created     REAL NOT NULL,
    UNIQUE (machine_id, sweep_id)
);

-- Where a budget's time went, one row per decision: runs added for the comparisons whose interval
-- one more run narrows most per second, or the end (the budget spent, or every comparison resolved
-- or narrow enough).
CREATE TABLE IF NOT EXISTS budget_decisions (
    decision_id INTEGER PRIMARY KEY AUTOINCREMENT,
    budget_id   INTEGER NOT NULL REFERENCES budgets (budget_id),
    decision    TEXT NOT NULL CHECK (decision IN ('added runs', 'spent', 'resolved')),
    spent_s     REAL NOT NULL,              -- seconds of the budget's runs when decided
    budget_s    REAL NOT NULL,              -- the budget then
    repeat      INTEGER,                    -- the pass the added runs form (jobs.repeat)
    jobs        INTEGER NOT NULL,           -- jobs added (0 for the end)
    predicted_s REAL,                       -- their predicted seconds (the ETA's per-job cost)
    sweep_id    INTEGER REFERENCES sweeps (sweep_id),  -- the sweep row of the added jobs
    chosen      TEXT NOT NULL,              -- JSON: the comparisons given runs: half-width, runs, why
    open        TEXT NOT NULL,              -- JSON: the comparisons still unresolved and wider than asked
    decide_s    REAL NOT NULL,              -- seconds the decision itself took (counted as spent)
    created     REAL NOT NULL
);
