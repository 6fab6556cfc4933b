use candle::DType;
use llama_kernels_candle::{fused_add_rms_norm, rms_norm, unfused};

use crate::common::{FLOATS, check, rand, tol, var};

#[test]
fn forward_and_gradients_match_candle_unfused_in_every_dtype() {
    for dtype in FLOATS {
        for (seed, shape) in [(1, vec![5, 64]), (2, vec![2, 3, 136]), (3, vec![1, 7])] {
            let hidden = *shape.last().unwrap();
            let x = rand(seed, &shape, dtype, 2.0);
            let w = rand(seed + 10, &[hidden], dtype, 1.0);
            let r = rand(seed + 20, &shape, DType::F64, 1.0);
            let (xv, wv) = (var(&x), var(&w));
            let y = rms_norm(xv.as_tensor(), wv.as_tensor(), 1e-5).unwrap();
            let loss = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            // The reference: candle's plain ops in f64 on the same (rounded) inputs.
            let (x64, w64) = (var(&x.to_dtype(DType::F64).unwrap()), var(&w.to_dtype(DType::F64).unwrap()));
            let y64 = unfused::rms_norm(x64.as_tensor(), w64.as_tensor(), 1e-5).unwrap();
            let g64 = y64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let what = format!("{dtype:?} {shape:?}");
            check(&format!("y {what}"), &y, &y64, tol(dtype));
            let dx = grads.get(xv.as_tensor()).unwrap();
            let dw = grads.get(wv.as_tensor()).unwrap();
            assert_eq!((dx.dtype(), dw.dtype()), (dtype, dtype));
            check(&format!("dx {what}"), dx, g64.get(x64.as_tensor()).unwrap(), 2.0 * tol(dtype));
            check(&format!("dw {what}"), dw, g64.get(w64.as_tensor()).unwrap(), 2.0 * tol(dtype));
        }
    }
}

#[test]
fn fused_add_matches_candle_add_then_norm_forward_and_gradients() {
    for dtype in FLOATS {
        let shape = [2, 5, 96];
        let x = rand(31, &shape, dtype, 1.0);
        let res = rand(32, &shape, dtype, 2.0);
        let w = rand(33, &[96], dtype, 1.0);
        let (ry, rs) = (rand(34, &shape, DType::F64, 1.0), rand(35, &shape, DType::F64, 1.0));
        let what = format!("fused_add {dtype:?}");
        let (xv, rv, wv) = (var(&x), var(&res), var(&w));
        let (y, sum) = fused_add_rms_norm(xv.as_tensor(), rv.as_tensor(), wv.as_tensor(), 1e-5).unwrap();
        let f64_of = |t: &candle::Tensor| t.to_dtype(DType::F64).unwrap();
        let loss = (f64_of(&y).mul(&ry).unwrap().sum_all().unwrap()
            + f64_of(&sum).mul(&rs).unwrap().sum_all().unwrap())
        .unwrap();
        let g = loss.backward().unwrap();

        let (x64, r64, w64) = (var(&f64_of(&x)), var(&f64_of(&res)), var(&f64_of(&w)));
        // The reference sums in f64; the kernel rounds the sum to the dtype before normalizing.
        let sum64 = (x64.as_tensor() + r64.as_tensor()).unwrap();
        let y64 = unfused::rms_norm(&sum64, w64.as_tensor(), 1e-5).unwrap();
        let loss64 = (y64.mul(&ry).unwrap().sum_all().unwrap() + sum64.mul(&rs).unwrap().sum_all().unwrap()).unwrap();
        let g64 = loss64.backward().unwrap();
        check(&format!("{what} sum"), &sum, &sum64, tol(dtype));
        check(&format!("{what} y"), &y, &y64, 2.0 * tol(dtype));
        for (name, ours, theirs) in [("dx", &xv, &x64), ("d_residual", &rv, &r64), ("dw", &wv, &w64)] {
            check(
                &format!("{what} {name}"),
                g.get(ours.as_tensor()).unwrap(),
                g64.get(theirs.as_tensor()).unwrap(),
                2.0 * tol(dtype),
            );
        }
    }
}
