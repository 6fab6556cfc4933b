use candle::{D, DType, Tensor};
use llama_kernels_candle::{swiglu, swiglu_packed, unfused};

use crate::common::{FLOATS, check, rand, tol, var};

#[test]
fn separate_and_packed_match_candle_unfused_forward_and_gradients() {
    for dtype in FLOATS {
        for (seed, shape) in [(1u64, vec![6, 64]), (2, vec![2, 3, 40]), (3, vec![1, 5])] {
            let what = format!("{dtype:?} {shape:?}");
            let gate = rand(seed, &shape, dtype, 4.0);
            let up = rand(seed + 1, &shape, dtype, 2.0);
            let r = rand(seed + 2, &shape, DType::F64, 1.0);
            let (g64, u64) = (var(&gate.to_dtype(DType::F64).unwrap()), var(&up.to_dtype(DType::F64).unwrap()));
            let y64 = unfused::swiglu(g64.as_tensor(), u64.as_tensor()).unwrap();
            let grads64 = y64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let (dg64, du64) = (grads64.get(g64.as_tensor()).unwrap(), grads64.get(u64.as_tensor()).unwrap());

            let (gv, uv) = (var(&gate), var(&up));
            let y = swiglu(gv.as_tensor(), uv.as_tensor()).unwrap();
            check(&format!("swiglu y {what}"), &y, &y64, tol(dtype));
            let grads = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            check(&format!("swiglu d_gate {what}"), grads.get(gv.as_tensor()).unwrap(), dg64, 2.0 * tol(dtype));
            check(&format!("swiglu d_up {what}"), grads.get(uv.as_tensor()).unwrap(), du64, 2.0 * tol(dtype));

            // The same through one packed [gate | up] tensor.
            let packed = var(&Tensor::cat(&[&gate, &up], D::Minus1).unwrap());
            let y = swiglu_packed(packed.as_tensor()).unwrap();
            check(&format!("swiglu_packed y {what}"), &y, &y64, tol(dtype));
            let grads = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let want = Tensor::cat(&[dg64, du64], D::Minus1).unwrap();
            check(
                &format!("swiglu_packed d_gate_up {what}"),
                grads.get(packed.as_tensor()).unwrap(),
                &want,
                2.0 * tol(dtype),
            );
        }
    }
}
