use candle::DType;
use llama_kernels_candle::{rms_norm, unfused};

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
