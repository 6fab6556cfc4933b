use candle::{D, DType, Device, Tensor};
use llama_kernels_candle::{CrossEntropyOptions, IGNORE_INDEX, Reduction, fused_linear_cross_entropy};

use crate::common::{FLOATS, check, rand, tol, var};

/// candle's unfused loss in f64: the full logits, log-softmax, the labelled rows' mean or sum.
fn plain(hidden: &Tensor, weight: &Tensor, labels: &[i64], reduction: Reduction) -> Tensor {
    let logits = hidden.matmul(&weight.t().unwrap()).unwrap();
    let max = logits.max_keepdim(D::Minus1).unwrap().detach();
    let shifted = logits.broadcast_sub(&max).unwrap();
    let lse = shifted.exp().unwrap().sum_keepdim(D::Minus1).unwrap().log().unwrap();
    let logp = shifted.broadcast_sub(&lse).unwrap();
    let vocab = weight.dim(0).unwrap();
    let onehot: Vec<f64> = labels
        .iter()
        .flat_map(|&l| (0..vocab as i64).map(move |v| if l != IGNORE_INDEX && v == l { 1.0 } else { 0.0 }))
        .collect();
    let onehot = Tensor::from_vec(onehot, (labels.len(), vocab), &Device::Cpu).unwrap();
    let sum = logp.mul(&onehot).unwrap().sum_all().unwrap().neg().unwrap();
    let counted = labels.iter().filter(|&&l| l != IGNORE_INDEX).count() as f64;
    match reduction {
        Reduction::Mean => (sum / counted).unwrap(),
        Reduction::Sum => sum,
    }
}

#[test]
fn chunked_loss_and_gradients_match_candle_unfused() {
    let (tokens, width, vocab) = (10, 32, 50);
    let labels: Vec<i64> = vec![3, 49, IGNORE_INDEX, 0, 7, 7, IGNORE_INDEX, 21, 1, 40];
    let lt = Tensor::new(labels.as_slice(), &Device::Cpu).unwrap();
    for dtype in FLOATS {
        for (reduction, chunk) in [(Reduction::Mean, Some(3)), (Reduction::Sum, None)] {
            let what = format!("{dtype:?} {reduction:?} chunk {chunk:?}");
            let h = rand(41, &[2, tokens / 2, width], dtype, 1.0);
            let w = rand(42, &[vocab, width], dtype, 0.5);
            let (hv, wv) = (var(&h), var(&w));
            let opts = CrossEntropyOptions { reduction, ..Default::default() };
            let loss = fused_linear_cross_entropy(hv.as_tensor(), wv.as_tensor(), &lt, &opts, chunk).unwrap();
            assert_eq!((loss.dims(), loss.dtype()), (&[][..], DType::F32));
            let g = (loss.to_dtype(DType::F64).unwrap() * 3.0).unwrap().backward().unwrap();
            let (h64, w64) = (var(&h.to_dtype(DType::F64).unwrap()), var(&w.to_dtype(DType::F64).unwrap()));
            let loss64 = plain(&h64.as_tensor().reshape((tokens, width)).unwrap(), w64.as_tensor(), &labels, reduction);
            let g64 = (&loss64 * 3.0).unwrap().backward().unwrap();
            // The logits are rounded to the dtype before the loss, as Hugging Face computes them.
            check(&format!("lm-head CE loss {what}"), &loss, &loss64, 2.0 * tol(dtype));
            check(
                &format!("lm-head CE d_hidden {what}"),
                g.get(hv.as_tensor()).unwrap(),
                g64.get(h64.as_tensor()).unwrap(),
                2.0 * tol(dtype),
            );
            check(
                &format!("lm-head CE d_weight {what}"),
                g.get(wv.as_tensor()).unwrap(),
                g64.get(w64.as_tensor()).unwrap(),
                2.0 * tol(dtype),
            );
        }
    }
}

#[test]
fn frozen_weight_gets_no_gradient_and_bad_labels_are_named() {
    let h = var(&rand(1, &[4, 16], DType::F32, 1.0));
    let w = rand(2, &[8, 16], DType::F32, 1.0);
    let labels = Tensor::new(&[1i32, 2, 3, 4], &Device::Cpu).unwrap();
    let loss = fused_linear_cross_entropy(h.as_tensor(), &w, &labels, &Default::default(), None).unwrap();
    let g = loss.backward().unwrap();
    assert!(g.get(&w).is_none() && g.get(h.as_tensor()).is_some());
    let bad = Tensor::new(&[1i32, 8, 3, 4], &Device::Cpu).unwrap();
    let e = fused_linear_cross_entropy(h.as_tensor(), &w, &bad, &Default::default(), None).unwrap_err().to_string();
    assert!(e.contains("cross_entropy") && e.contains("label"), "{e}");
    let short = Tensor::new(&[1i32, 2], &Device::Cpu).unwrap();
    let e = fused_linear_cross_entropy(h.as_tensor(), &w, &short, &Default::default(), None).unwrap_err().to_string();
    assert!(e.contains("labels"), "{e}");
}
