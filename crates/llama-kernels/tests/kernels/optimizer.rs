//! AdamW with global-norm clipping and loss scaling (`ops::optimizer`): several steps over
//! tensors of every dtype (with and without f32 masters, several chunks each) against the f64
//! reference; PyTorch's clip_grad_norm_ + AdamW; skipped steps, back-off and growth of the loss
//! scale; the learning rate from the device; bit-identical under every schedule; validation.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dtype::round_to;
use llama_kernels::ops::optimizer::{AdamW, AdamWConfig, LossScaling, Lr, ParamSlot};
use llama_kernels::reference::optimizer::{AdamWSpec, Slot, adamw_step};
use llama_kernels::{DType, Device, Error, Tensor};

/// (param dtype, grad dtype, master, numel) of the test group.
const GROUP: [(DType, DType, bool, usize); 4] = [
    (DType::F32, DType::F32, false, 5000),
    (DType::BF16, DType::BF16, true, 300),
    (DType::F16, DType::F32, false, 4097),
    (DType::BF16, DType::F16, false, 9),
];

fn spec(c: &AdamWConfig) -> AdamWSpec {
    AdamWSpec {
        beta1: f64::from(c.beta1),
        beta2: f64::from(c.beta2),
        eps: f64::from(c.eps),
        weight_decay: f64::from(c.weight_decay),
        max_norm: c.max_grad_norm.map(f64::from),
    }
}

/// Runs `steps` steps of the group on `device`; returns every parameter's final values (bits).
fn run_group(device: &Device, config: AdamWConfig, lrs: &[f32], check: bool) -> Vec<Vec<u64>> {
    let mut rng = Rng::new(17);
    let scale = config.loss_scaling.map_or(1.0, |s| f64::from(s.init_scale));
    let mut refs = Vec::new();
    let mut tensors = Vec::new();
    for &(pt, gt, master, n) in &GROUP {
        let p0 = rng.normal_vec(n, 1.0, pt);
        let param = Tensor::from_f64(device, pt, &p0, &[n]).unwrap();
        let grad = Tensor::zeros(device, gt, &[n]).unwrap();
        let m = master.then(|| Tensor::from_f64(device, DType::F32, &p0, &[n]).unwrap());
        tensors.push((param, grad, m));
        refs.push(Slot { param: p0, m: vec![0.0; n], v: vec![0.0; n] });
    }
    let slots: Vec<ParamSlot> =
        tensors.iter().map(|(p, g, m)| ParamSlot { param: p, grad: g, master: m.as_ref() }).collect();
    let opt = AdamW::new(device, &slots, config).unwrap();
    for (step, &lr) in lrs.iter().enumerate() {
        // Gradients times the loss scale, rounded to their dtype (what a scaled backward gives).
        let grads: Vec<Vec<f64>> = GROUP.iter().map(|&(_, gt, _, n)| rng.normal_vec(n, 3.0 * scale, gt)).collect();
        for ((_, g, _), v) in tensors.iter().zip(&grads) {
            g.copy_from_f64(v).unwrap();
        }
        opt.step(Lr::Host(lr)).unwrap();
        let out = adamw_step(&mut refs, &grads, scale, step as u64, f64::from(lr), &spec(&config));
        if check {
            let stats = opt.stats().unwrap();
            assert!(!stats.found_inf && stats.step == step as i64 + 1, "{stats:?}");
            assert!((f64::from(stats.grad_norm) - out.grad_norm).abs() < 1e-6 * out.grad_norm, "{stats:?} vs {out:?}");
            for (i, ((p, _, m), r)) in tensors.iter().zip(&refs).enumerate() {
                let (pt, _, master, n) = GROUP[i];
                // f32 math on f32 state: a few ulps per step; a parameter without a master is
                // rounded to its dtype every step.
                let steps = (step + 1) as f64;
                let tol = if master || pt == DType::F32 {
                    Tolerance { atol: 1e-6 * steps, rtol: 1e-6 * steps }
                } else {
                    Tolerance { atol: 1e-6, rtol: steps * pt.unit_roundoff() * 1.01 }
                };
                let want: Vec<f64> =
                    if master { r.param.iter().map(|&v| round_to(pt, v)).collect() } else { r.param.clone() };
                let ptol = if master { Tolerance { atol: tol.atol, rtol: tol.rtol + pt.unit_roundoff() } } else { tol };
                let cmp = compare(&p.to_f64_vec().unwrap(), &want, ptol);
                assert!(cmp.pass, "slot {i} step {step}: {}", cmp.describe(&[n]));
                if let Some(m) = m {
                    let cmp = compare(&m.to_f64_vec().unwrap(), &r.param, tol);
                    assert!(cmp.pass, "slot {i} master step {step}: {}", cmp.describe(&[n]));
                }
            }
        }
    }
    tensors.iter().map(|(p, _, _)| p.to_f64_vec().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn steps_match_the_reference_with_and_without_clipping() {
    for device in common::devices() {
        let lrs = [1e-3, 5e-4, 2e-3, 1e-4];
        run_group(&device, AdamWConfig::default(), &lrs, true);
        run_group(
            &device,
            AdamWConfig { max_grad_norm: Some(1.0), weight_decay: 0.1, ..AdamWConfig::default() },
            &lrs,
            true,
        );
        let scaled = AdamWConfig {
            loss_scaling: Some(LossScaling { init_scale: 1024.0, ..LossScaling::default() }),
            ..AdamWConfig::default()
        };
        run_group(&device, scaled, &lrs[..2], true);
    }
}

#[test]
fn schedules_give_bit_identical_parameters() {
    let config = AdamWConfig { max_grad_norm: Some(1.0), ..AdamWConfig::default() };
    let runs: Vec<_> = common::schedule_devices().iter().map(|d| run_group(d, config, &[1e-3, 1e-3], false)).collect();
    assert!(runs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn matches_pytorch_clip_grad_norm_and_adamw() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let c = fixture["cases"].as_array().unwrap().iter().find(|c| c["op"] == "adamw").expect("an adamw case");
    let f64s = |v: &serde_json::Value| crate::rms_norm_backward::f64s(v.as_str().unwrap());
    let d = Device::emulated();
    let shapes: Vec<Vec<usize>> = c["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect())
        .collect();
    let params: Vec<Tensor> = c["init"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&shapes)
        .map(|(v, s)| Tensor::from_f64(&d, DType::F32, &f64s(v), s).unwrap())
        .collect();
    let grads: Vec<Tensor> = shapes.iter().map(|s| Tensor::zeros(&d, DType::F32, s).unwrap()).collect();
    let slots: Vec<ParamSlot> =
        params.iter().zip(&grads).map(|(p, g)| ParamSlot { param: p, grad: g, master: None }).collect();
    let f = |k: &str| c[k].as_f64().unwrap() as f32;
    let config = AdamWConfig {
        beta1: f("beta1"),
        beta2: f("beta2"),
        eps: f("eps"),
        weight_decay: f("weight_decay"),
        max_grad_norm: Some(f("max_norm")),
        loss_scaling: None,
    };
    let opt = AdamW::new(&d, &slots, config).unwrap();
    for (i, step) in c["steps"].as_array().unwrap().iter().enumerate() {
        for (g, v) in grads.iter().zip(step["grads"].as_array().unwrap()) {
            g.copy_from_f64(&f64s(v)).unwrap();
        }
        opt.step(Lr::Host(step["lr"].as_f64().unwrap() as f32)).unwrap();
        let norm = step["norm"].as_f64().unwrap();
        let got = f64::from(opt.stats().unwrap().grad_norm);
        assert!((got - norm).abs() < 1e-6 * norm, "step {i}: norm {got} vs torch {norm}");
        for (p, v) in params.iter().zip(step["params"].as_array().unwrap()) {
            let cmp = compare(&p.to_f64_vec().unwrap(), &f64s(v), Tolerance { atol: 1e-6, rtol: 1e-6 });
            assert!(cmp.pass, "step {i}: {}", cmp.describe(p.shape()));
        }
    }
}

#[test]
fn a_non_finite_gradient_skips_the_step_and_the_scale_backs_off_then_grows() {
    let d = Device::emulated();
    let p = Tensor::from_f64(&d, DType::F16, &[1.0, 2.0, 3.0], &[3]).unwrap();
    let g = Tensor::from_f64(&d, DType::F16, &[1.0, f64::INFINITY, 1.0], &[3]).unwrap();
    let scaling = LossScaling { init_scale: 8.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2 };
    let opt = AdamW::new(
        &d,
        &[ParamSlot { param: &p, grad: &g, master: None }],
        AdamWConfig { loss_scaling: Some(scaling), ..Default::default() },
    )
    .unwrap();
    let before = p.to_f64_vec().unwrap();
    opt.step(Lr::Host(0.1)).unwrap();
    let s = opt.stats().unwrap();
    assert!(s.found_inf && s.step == 0 && s.loss_scale == 4.0, "{s:?}");
    assert_eq!(p.to_f64_vec().unwrap(), before, "a skipped step writes nothing");
    g.copy_from_f64(&[f64::NAN, 0.0, 0.0]).unwrap();
    opt.step(Lr::Host(0.1)).unwrap();
    assert_eq!(opt.stats().unwrap().loss_scale, 2.0);
    g.copy_from_f64(&[4.0, 4.0, -4.0]).unwrap();
    opt.step(Lr::Host(0.1)).unwrap();
    let s = opt.stats().unwrap();
    assert!(!s.found_inf && s.step == 1 && s.loss_scale == 2.0, "{s:?}");
    assert_ne!(p.to_f64_vec().unwrap(), before);
    opt.step(Lr::Host(0.1)).unwrap();
    let s = opt.stats().unwrap();
    assert!(s.step == 2 && s.loss_scale == 4.0, "two finite steps grow the scale: {s:?}");
    assert!(
        (f64::from(s.grad_norm) - (48.0f64).sqrt() / 2.0).abs() < 1e-5,
        "the norm of the unscaled gradients: {s:?}"
    );
}

#[test]
fn the_learning_rate_can_come_from_the_device() {
    let d = Device::emulated();
    let run = |lr: Option<&Tensor>| {
        let p = Tensor::from_f64(&d, DType::BF16, &[1.0, -1.0, 0.5], &[3]).unwrap();
        let g = Tensor::from_f64(&d, DType::BF16, &[0.25, 0.5, -1.0], &[3]).unwrap();
        let opt = AdamW::new(&d, &[ParamSlot { param: &p, grad: &g, master: None }], AdamWConfig::default()).unwrap();
        opt.step(lr.map_or(Lr::Host(0.01), Lr::Device)).unwrap();
        p.to_f64_vec().unwrap()
    };
    let lr = Tensor::from_f64(&d, DType::F32, &[0.01], &[1]).unwrap();
    assert_eq!(run(Some(&lr)), run(None));
}

fn slot<'a>(param: &'a Tensor, grad: &'a Tensor, master: Option<&'a Tensor>) -> [ParamSlot<'a>; 1] {
    [ParamSlot { param, grad, master }]
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let (p, g) = (t(DType::BF16, &[4]), t(DType::BF16, &[4]));
    let c = AdamWConfig::default();
    let e = AdamW::new(&d, &slot(&p, &t(DType::BF16, &[5]), None), c).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "grad", .. }), "{e}");
    let e = AdamW::new(&d, &slot(&p, &t(DType::I32, &[4]), None), c).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "grad", .. }), "{e}");
    let e = AdamW::new(&d, &slot(&p, &g, Some(&t(DType::BF16, &[4]))), c).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "master", .. }), "{e}");
    let wide = t(DType::BF16, &[4, 2]);
    let e = AdamW::new(&d, &slot(&wide.narrow(1, 0, 1).unwrap(), &t(DType::BF16, &[4, 1]), None), c).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "param", .. }), "{e}");
    let e = AdamW::new(&d, &slot(&p, &g, None), AdamWConfig { beta1: 1.0, ..c }).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "beta1", .. }), "{e}");
    let e = AdamW::new(&d, &slot(&p, &g, None), AdamWConfig { max_grad_norm: Some(0.0), ..c }).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "max_grad_norm", .. }), "{e}");
    let opt = AdamW::new(&d, &slot(&p, &g, None), c).unwrap();
    let e = opt.step(Lr::Host(f32::NAN)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "lr", .. }), "{e}");
    let e = opt.step(Lr::Device(&t(DType::F16, &[1]))).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "lr", .. }), "{e}");
    // No tensors at all: a step only counts.
    let empty = AdamW::new(&d, &[], c).unwrap();
    empty.step(Lr::Host(1e-3)).unwrap();
    assert_eq!(empty.stats().unwrap().step, 1);
}

#[test]
fn the_verify_rows_pass() {
    // What `verify` prints for AdamW: every parameter dtype, with and without an f32 master.
    let device = Device::emulated();
    for case in llama_kernels::dev::verify::adamw_cases(true) {
        let r = llama_kernels::dev::verify::adamw_case(&device, case).unwrap();
        assert!(r.pass, "{case:?}: {}", r.describe());
    }
}
