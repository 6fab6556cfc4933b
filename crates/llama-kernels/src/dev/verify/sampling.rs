//! `verify` cases of token sampling: every sampled token lies in the reference's filtered set
//! (greedy: is the argmax), and how often it is exactly the reference's draw for the same
//! random word.

use std::time::Instant;

use super::common::CaseResult;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::ErrorFlag;
use crate::ops::sampling::{SamplingBatch, sample};
use crate::reference::sampling::{Filtered, filter, sample as reference_sample};
use crate::spec::sampling::SamplingConfig;
use crate::tensor::Tensor;

/// The byte tokens are poisoned with before a launch: 0x5a5a5a5a is no token and not -1.
pub const TOKEN_POISON: u8 = 0x5a;

/// One launch's results: the tokens, and what the error flag said.
#[derive(Debug)]
pub struct SampleRun {
    pub tokens: Vec<i32>,
    pub flag: Result<()>,
    pub millis: f64,
}

/// Samples `rows` (each `vocab` long, already rounded to `dtype`) on `device` with one config,
/// seed and offset per row. With `pad > 0` the rows lie `vocab + pad` apart (a strided view into
/// a NaN-poisoned buffer). Tokens are poisoned ([`TOKEN_POISON`]) before the launch.
pub fn run_sample(
    device: &Device,
    dtype: DType,
    rows: &[Vec<f64>],
    configs: &[SamplingConfig],
    seeds: &[u64],
    offsets: &[u64],
    pad: usize,
) -> Result<SampleRun> {
    let batch = rows.len();
    let vocab = rows.first().map_or(0, Vec::len);
    let flat: Vec<f64> = rows.concat();
    let (logits, _full) = super::common::rows_tensor(device, dtype, &flat, batch, vocab, pad)?;
    let params = SamplingBatch::new(device, configs, seeds, offsets)?;
    let tokens = Tensor::zeros(device, DType::I32, &[batch])?;
    tokens.fill_bytes(TOKEN_POISON)?;
    let errors = ErrorFlag::new(device)?;
    let start = Instant::now();
    sample(&logits, &params.tensors(), &tokens, &errors)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    Ok(SampleRun { tokens: tokens.to_vec::<i32>()?, flag: errors.check_sampling(), millis })
}

/// Whether `token` is a token the reference allows for this row: the argmax (greedy), one of
/// positive filtered probability, or -1 where the reference says -1.
pub fn token_allowed(row: &[f64], cfg: &SamplingConfig, token: i32) -> bool {
    match filter(row, cfg) {
        Filtered::Argmax(i) => token == i as i32,
        Filtered::Distribution(p) => token >= 0 && p.get(token as usize).is_some_and(|&q| q > 0.0),
        Filtered::BadParams | Filtered::NoCandidate => token == -1,
    }
}

/// A seeded random sampling configuration: greedy in 1 of 8 rows; otherwise temperature in
/// [0.3, 2) and each filter on or off.
pub fn random_config(rng: &mut Rng, vocab: usize) -> SamplingConfig {
    if rng.below(8) == 0 {
        return SamplingConfig::GREEDY;
    }
    let top_k = match rng.below(6) {
        0 | 1 => 0,
        2 => 1 + rng.below(8) as i32,
        3 => 1 + rng.below(vocab as u64) as i32,
        4 => vocab as i32 + 3,
        _ => 50,
    };
    let top_p = match rng.below(5) {
        0 | 1 => 1.0,
        2 => 0.0,
        _ => rng.range(0.05, 0.99) as f32,
    };
    let min_p = match rng.below(4) {
        0 | 1 => 0.0,
        2 => rng.range(0.001, 0.1) as f32,
        _ => rng.range(0.1, 0.9) as f32,
    };
    SamplingConfig { temperature: rng.range(0.3, 2.0) as f32, top_k, top_p, min_p }
}

/// Random logits for one row (std `scale`, rounded to `dtype`), with a few planted exact ties,
/// a NaN and a -inf when `specials`.
pub fn random_row(rng: &mut Rng, vocab: usize, scale: f64, dtype: DType, specials: bool) -> Vec<f64> {
    let mut row = rng.normal_vec(vocab, scale, dtype);
    let n = vocab as u64;
    for _ in 0..3 {
        // A tie with the max, and a tie somewhere in the middle.
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row[rng.below(n) as usize] = max;
        let v = row[rng.below(n) as usize];
        row[rng.below(n) as usize] = v;
    }
    if specials && vocab > 4 {
        row[rng.below(n) as usize] = f64::NAN;
        row[rng.below(n) as usize] = f64::NEG_INFINITY;
    }
    row
}

/// A sampling case for `verify` and the schedule tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleCase {
    pub dtype: DType,
    pub batch: usize,
    pub vocab: usize,
    /// Extra elements between logits rows.
    pub pad: usize,
    pub seed: u64,
}

impl SampleCase {
    pub fn new(dtype: DType, batch: usize, vocab: usize) -> SampleCase {
        SampleCase { dtype, batch, vocab, pad: 0, seed: 17 }
    }
}

/// Runs a case of random rows and configurations: passes when every token is allowed by the
/// reference and the flag is clear. `max_abs` is 1 if any token is not allowed; the shape column
/// also counts the rows whose token is exactly the reference's draw for the same random word.
pub fn sample_case(device: &Device, case: SampleCase) -> Result<CaseResult> {
    let SampleCase { dtype, batch, vocab, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (batch as u64) << 20 ^ (vocab as u64) << 36);
    let rows: Vec<Vec<f64>> = (0..batch).map(|_| random_row(&mut rng, vocab, 2.0, dtype, true)).collect();
    let configs: Vec<SamplingConfig> = (0..batch).map(|_| random_config(&mut rng, vocab)).collect();
    let seeds: Vec<u64> = (0..batch).map(|_| rng.next_u64()).collect();
    let offsets: Vec<u64> = (0..batch).map(|_| rng.next_u64() >> 8).collect();
    let run = run_sample(device, dtype, &rows, &configs, &seeds, &offsets, pad)?;
    let allowed: Vec<f64> =
        (0..batch).map(|r| f64::from(u8::from(token_allowed(&rows[r], &configs[r], run.tokens[r])))).collect();
    let same = (0..batch).filter(|&r| run.tokens[r] == reference_sample(&rows[r], &configs[r], seeds[r], offsets[r]));
    let same = same.count();
    let comparison = compare(&allowed, &vec![1.0; batch], Tolerance { atol: 0.0, rtol: 0.0 });
    Ok(CaseResult {
        op: "sample".into(),
        dtype,
        shape: format!("{batch}x{vocab}{} ({same}/{batch} = reference draw)", if pad > 0 { " strided" } else { "" }),
        pass: comparison.pass && run.flag.is_ok(),
        comparison,
        worst_shape: vec![batch],
        gaps_untouched: true,
        millis: run.millis,
        outputs: vec![run.tokens.iter().map(|&t| f64::from(t)).collect()],
    })
}

/// The sampling cases `verify` runs (Llama 3's vocabulary is 128256).
pub fn sample_cases(quick: bool) -> Vec<SampleCase> {
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(SampleCase::new(dtype, 16, 1000));
        v.push(SampleCase { pad: 5, ..SampleCase::new(dtype, 4, 4099) });
        v.push(SampleCase::new(dtype, if quick { 2 } else { 64 }, if quick { 32000 } else { 128256 }));
    }
    v
}
