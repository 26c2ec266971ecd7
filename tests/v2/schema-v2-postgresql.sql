CREATE TABLE IF NOT EXISTS schema_version (
    version     BIGINT PRIMARY KEY,
    applied     DOUBLE PRECISION NOT NULL,                
    note        TEXT NOT NULL                 
);
CREATE TABLE IF NOT EXISTS machines (
    machine_id        BIGSERIAL PRIMARY KEY,
    fingerprint       TEXT NOT NULL UNIQUE,   
    hostname          TEXT,
    cpu_model         TEXT,
    vendor            TEXT,
    sockets           BIGINT,
    physical_cores    BIGINT,
    logical_cores     BIGINT,
    numa_nodes        BIGINT,
    smt               BOOLEAN,
    isa_flags         TEXT,                   
    l1d_kb            BIGINT,
    l2_kb             BIGINT,
    l3_kb             BIGINT,
    mem_total_gb      DOUBLE PRECISION,
    mem_bw_gbs_1t     DOUBLE PRECISION,                   
    mem_bw_gbs_all    DOUBLE PRECISION,                   
    gemm_gflops_fp32_1c  DOUBLE PRECISION,                
    gemm_gflops_fp32_all DOUBLE PRECISION,
    gemm_gflops_bf16_1c  DOUBLE PRECISION,
    gemm_gflops_bf16_all DOUBLE PRECISION,
    freq_driver       TEXT,                   
    freq_min_mhz      BIGINT,
    freq_max_mhz      BIGINT,
    kernel            TEXT,
    torch_version     TEXT,
    knobs             TEXT,                   
    facts             TEXT NOT NULL,          
    first_seen        DOUBLE PRECISION NOT NULL,
    last_seen         DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id    BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    source      TEXT NOT NULL,                
    text        TEXT NOT NULL,                
    text_sha    TEXT NOT NULL,
    notes       TEXT,                         
    created     DOUBLE PRECISION NOT NULL,
    UNIQUE (name, text_sha)                   
);
CREATE TABLE IF NOT EXISTS jobs (
    job_id        BIGSERIAL PRIMARY KEY,
    config_hash   TEXT NOT NULL UNIQUE,       
    sweep_id      BIGINT NOT NULL REFERENCES sweeps (sweep_id),  
    run_order     BIGINT NOT NULL,           
    config        TEXT NOT NULL,              
    
    
    
    
    derived       TEXT,
    created       DOUBLE PRECISION NOT NULL,
    
    cores         BIGINT NOT NULL,
    freq_mhz      BIGINT,
    governor      TEXT    NOT NULL,
    turbo         TEXT    NOT NULL,
    pin_threads   BOOLEAN NOT NULL,
    numa          TEXT    NOT NULL,
    allocator     TEXT    NOT NULL,
    omp_threads   BIGINT NOT NULL,
    intra_threads BIGINT NOT NULL,
    inter_threads BIGINT NOT NULL,
    isa           TEXT    NOT NULL,
    onednn        BOOLEAN NOT NULL,
    framework     TEXT    NOT NULL,
    compile       TEXT    NOT NULL,
    fusion        BOOLEAN NOT NULL,
    compile_cache TEXT    NOT NULL,
    attn_backend  TEXT    NOT NULL,
    n_layers      BIGINT NOT NULL,
    d_model       BIGINT NOT NULL,
    n_heads       BIGINT NOT NULL,
    head_dim      BIGINT NOT NULL,
    kv_heads      BIGINT NOT NULL,
    mlp_ratio     DOUBLE PRECISION    NOT NULL,
    dropout       DOUBLE PRECISION    NOT NULL,
    activation    TEXT    NOT NULL,
    attention     TEXT    NOT NULL,
    "window"      BIGINT NOT NULL,
    vocab_size    BIGINT NOT NULL,
    seq_len       BIGINT NOT NULL,
    batch_size    BIGINT NOT NULL,
    grad_accum    BIGINT NOT NULL,
    precision     TEXT    NOT NULL,
    optimizer     TEXT    NOT NULL,
    task          TEXT    NOT NULL,
    steps         BIGINT NOT NULL,
    warmup_steps  BIGINT NOT NULL,
    seed          BIGINT NOT NULL,
    dataset       TEXT    NOT NULL,
    repeat        BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_run_order ON jobs (run_order, job_id);
CREATE TABLE IF NOT EXISTS sweep_jobs (
    sweep_id  BIGINT NOT NULL REFERENCES sweeps (sweep_id),
    job_id    BIGINT NOT NULL REFERENCES jobs (job_id),
    PRIMARY KEY (sweep_id, job_id)
);
CREATE TABLE IF NOT EXISTS pools (
    pool_id     BIGSERIAL PRIMARY KEY,
    name        TEXT UNIQUE,                  
    machine_id  BIGINT UNIQUE REFERENCES machines (machine_id),  
    filled      DOUBLE PRECISION,                         
    created     DOUBLE PRECISION NOT NULL,
    CHECK ((name IS NULL) <> (machine_id IS NULL))
);
CREATE TABLE IF NOT EXISTS runs (
    run_id        BIGSERIAL PRIMARY KEY,
    job_id        BIGINT NOT NULL REFERENCES jobs (job_id),
    machine_id    BIGINT NOT NULL REFERENCES machines (machine_id),  
    pool_id       BIGINT NOT NULL REFERENCES pools (pool_id),        
    status        TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'skipped')),
    attempts      BIGINT NOT NULL DEFAULT 0, 
    worker_pid    BIGINT,
    worker_host   TEXT,
    child_pid     BIGINT,
    claimed       DOUBLE PRECISION,
    heartbeat     DOUBLE PRECISION,
    finished      DOUBLE PRECISION,
    reason        TEXT,                       
    applied       TEXT,                       
    dataset_used  TEXT,                       
    output_path   TEXT,                       
    torch_version TEXT,
    python_version TEXT,
    build_info    TEXT,                       
    load_before   DOUBLE PRECISION,                       
    
    setup_s        DOUBLE PRECISION,                      
    first_step_s   DOUBLE PRECISION,                      
    step_ms_median DOUBLE PRECISION,
    step_ms_p10    DOUBLE PRECISION,
    step_ms_p90    DOUBLE PRECISION,
    step_ms_mean   DOUBLE PRECISION,
    step_ms_std    DOUBLE PRECISION,
    train_s        DOUBLE PRECISION,                      
    wall_s         DOUBLE PRECISION,                      
    tokens_per_s   DOUBLE PRECISION,                      
    samples_per_s  DOUBLE PRECISION,
    loss_first     DOUBLE PRECISION,
    loss_last      DOUBLE PRECISION,
    peak_rss_mb    DOUBLE PRECISION,
    cpu_user_s     DOUBLE PRECISION,
    cpu_sys_s      DOUBLE PRECISION,
    ctx_switches   BIGINT,                   
    freq_mhz_avg   DOUBLE PRECISION,
    energy_j       DOUBLE PRECISION,
    temp_c_max     DOUBLE PRECISION,
    params         BIGINT,
    flops_per_step DOUBLE PRECISION,
    gflops         DOUBLE PRECISION,                      
    mfu            DOUBLE PRECISION,                      
    UNIQUE (job_id, pool_id)
);
CREATE INDEX IF NOT EXISTS runs_by_machine_status ON runs (machine_id, status);
CREATE INDEX IF NOT EXISTS runs_by_pool_status ON runs (pool_id, status);
CREATE TABLE IF NOT EXISTS queue (
    pool_id     BIGINT NOT NULL REFERENCES pools (pool_id),
    job_id      BIGINT NOT NULL REFERENCES jobs (job_id),
    run_order   BIGINT NOT NULL,
    cores       BIGINT NOT NULL,
    PRIMARY KEY (pool_id, job_id)
);
CREATE INDEX IF NOT EXISTS queue_in_run_order ON queue (pool_id, run_order, job_id);
CREATE OR REPLACE VIEW v_results AS
SELECT
    r.run_id, r.status, r.attempts, r.reason, r.claimed, r.finished,
    s.name AS sweep,
    r.pool_id, COALESCE(p.name, 'machine ' || r.machine_id) AS pool, r.worker_host,
    j.job_id, j.config_hash, j.derived,
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
JOIN pools p ON p.pool_id = r.pool_id
WHERE r.status <> 'queued';
CREATE TABLE IF NOT EXISTS effects (
    effect_id   BIGSERIAL PRIMARY KEY,
    machine_id  BIGINT NOT NULL REFERENCES machines (machine_id),
    variable    TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('elasticity', 'ratio')),
    value       TEXT,                       
    baseline    TEXT,                       
    estimate    DOUBLE PRECISION NOT NULL,
    ci_low      DOUBLE PRECISION,                       
    ci_high     DOUBLE PRECISION,
    n_runs      BIGINT NOT NULL,           
    created     DOUBLE PRECISION NOT NULL,
    ci_adj_low  DOUBLE PRECISION,                       
    ci_adj_high DOUBLE PRECISION,
    se          DOUBLE PRECISION,                       
    dof         DOUBLE PRECISION,                       
    p_value     DOUBLE PRECISION,                       
    p_adjusted  DOUBLE PRECISION,                       
    significant BOOLEAN,                    
    family      BIGINT,                    
    method      TEXT,                       
    min_runs    BIGINT,                    
    n_passes    BIGINT,                    
    half_width  DOUBLE PRECISION,                       
                                            
    target_met  BOOLEAN,                    
    repeats_needed BIGINT                  
                                            
);
CREATE INDEX IF NOT EXISTS effects_by_machine ON effects (machine_id, variable);
CREATE TABLE IF NOT EXISTS adaptive_decisions (
    decision_id BIGSERIAL PRIMARY KEY,
    machine_id  BIGINT NOT NULL REFERENCES machines (machine_id),
    decision    TEXT NOT NULL CHECK (decision IN ('added pass', 'targets met', 'maximum reached')),
    repeat      BIGINT,                    
    jobs        BIGINT NOT NULL,           
    target_ci   DOUBLE PRECISION NOT NULL,              
    max_repeats BIGINT NOT NULL,
    wide        TEXT NOT NULL,              
    created     DOUBLE PRECISION NOT NULL
);
