use candle::{DType, Tensor};
use llama_kernels_candle::{Lora, LoraConfig, unfused};

use crate::common::{FLOATS, check, rand, tol, var};

#[test]
fn branch_with_dropout_matches_candle_unfused_forward_and_gradients() {
    for dtype in FLOATS {
        for (seed, dropout, lead) in [(1u64, 0.0, vec![7]), (2, 0.25, vec![2, 5])] {
            let (d_in, d_out, r) = (48, 40, 8);
            let lora = Lora { config: LoraConfig { r, alpha: 16.0, dropout, rslora: false }, seed, stream: 3 };
            let x_dims: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
            let x = rand(seed, &x_dims, dtype, 1.0);
            let a = rand(seed + 1, &[r, d_in], dtype, 0.3);
            let b = rand(seed + 2, &[d_out, r], dtype, 0.3);
            let y_dims: Vec<usize> = lead.iter().copied().chain([d_out]).collect();
            let rr = rand(seed + 3, &y_dims, DType::F64, 1.0);
            let what = format!("{dtype:?} dropout {dropout} x {x_dims:?}");

            let to64 = |t: &Tensor| var(&t.to_dtype(DType::F64).unwrap());
            let (x64, a64, b64) = (to64(&x), to64(&a), to64(&b));
            let y64 = unfused::lora_branch(x64.as_tensor(), a64.as_tensor(), b64.as_tensor(), &lora).unwrap();
            let g64 = y64.mul(&rr).unwrap().sum_all().unwrap().backward().unwrap();

            let (xv, av, bv) = (var(&x), var(&a), var(&b));
            let y = lora.branch(xv.as_tensor(), av.as_tensor(), bv.as_tensor()).unwrap();
            // Roundings to the dtype on the way: dropout(x), h, y.
            check(&format!("lora y {what}"), &y, &y64, 2.0 * tol(dtype));
            let g = y.to_dtype(DType::F64).unwrap().mul(&rr).unwrap().sum_all().unwrap().backward().unwrap();
            for (name, ours, theirs) in [("dx", &xv, &x64), ("dA", &av, &a64), ("dB", &bv, &b64)] {
                let got = g.get(ours.as_tensor()).unwrap();
                check(&format!("lora {name} {what}"), got, g64.get(theirs.as_tensor()).unwrap(), 2.0 * tol(dtype));
            }
        }
    }
}
