//! Which GGUF tensor holds each Hugging Face layer tensor, and how it is rearranged.
//!
//! | Hugging Face (relative to the layer)            | GGUF (`blk.N.`)                   |
//! | ----------------------------------------------- | --------------------------------- |
//! | `input_layernorm.weight`                        | `attn_norm.weight`                |
//! | `self_attn.{q,k,v,o}_proj.{weight,bias}`        | `attn_{q,k,v,output}.{weight,bias}` |
//! | `post_attention_layernorm.weight`               | `ffn_norm.weight`                 |
//! | `{mlp,feed_forward}.{gate,up,down}_proj.*`      | `ffn_{gate,up,down}.*`            |
//! | `feed_forward.router.weight` `[E, h]`           | `ffn_gate_inp.weight` `[E, h]`    |
//! | `feed_forward.experts.gate_up_proj` `[E, h, 2I]` | `ffn_gate_exps.weight` and `ffn_up_exps.weight`, `[E, I, h]` each |
//! | `feed_forward.experts.down_proj` `[E, I, h]`    | `ffn_down_exps.weight` `[E, h, I]` |
//! | `feed_forward.shared_expert.{gate,up,down}_proj.weight` | `ffn_{gate,up,down}_shexp.weight` |
//!
//! (shapes slowest-varying first, as PyTorch writes them). llama.cpp's converter transposes
//! Llama 4's fused expert tensors (stored `x @ W` in Hugging Face) into per-expert `[out, in]`
//! matrices and splits gate from up; [`Source`] says how to put them back. For the `llama`
//! architecture the q and k rows of every head are reordered by the converter for interleaved
//! RoPE ([`unpermute_order`] restores them); `llama4` stores them as Hugging Face does.

use super::GgufArch;

/// Where a Hugging Face layer tensor comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One GGUF tensor of the same shape; for `llama`'s q and k, with the rows of each of
    /// `unpermute_heads` heads restored ([`unpermute_order`]).
    Tensor {
        /// The GGUF tensor (`blk.N.attn_q.weight`).
        name: String,
        /// Heads whose rows the `llama` converter permuted (q and k), or `None`.
        unpermute_heads: Option<usize>,
    },
    /// `gate_up_proj` `[E, h, 2I]`: element `[e, c, j]` is `gate[e, j, c]` for `j < I` and
    /// `up[e, j - I, c]` above (both `[E, I, h]`).
    ExpertsGateUp {
        /// `blk.N.ffn_gate_exps.weight`.
        gate: String,
        /// `blk.N.ffn_up_exps.weight`.
        up: String,
    },
    /// `down_proj` `[E, I, h]`: the transpose of each expert's `[h, I]` matrix.
    ExpertsDown {
        /// `blk.N.ffn_down_exps.weight`.
        name: String,
    },
}

/// Where layer `layer`'s Hugging Face tensor `hf` (`self_attn.q_proj.weight`, ...) is in a file
/// of architecture `arch`, for a layer of `q_heads` / `kv_heads` heads; `None` for a name with
/// no GGUF counterpart.
pub fn source(arch: GgufArch, layer: usize, hf: &str, q_heads: usize, kv_heads: usize) -> Option<Source> {
    let blk = |base: &str| format!("blk.{layer}.{base}");
    let (module, kind) = hf.rsplit_once('.')?;
    let (module, kind) = match (module, kind) {
        ("feed_forward.experts", "gate_up_proj") => {
            return Some(Source::ExpertsGateUp { gate: blk("ffn_gate_exps.weight"), up: blk("ffn_up_exps.weight") });
        }
        ("feed_forward.experts", "down_proj") => {
            return Some(Source::ExpertsDown { name: blk("ffn_down_exps.weight") });
        }
        other => other,
    };
    let base = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" | "feed_forward.gate_proj" => "ffn_gate",
        "mlp.up_proj" | "feed_forward.up_proj" => "ffn_up",
        "mlp.down_proj" | "feed_forward.down_proj" => "ffn_down",
        "feed_forward.router" => "ffn_gate_inp",
        "feed_forward.shared_expert.gate_proj" => "ffn_gate_shexp",
        "feed_forward.shared_expert.up_proj" => "ffn_up_shexp",
        "feed_forward.shared_expert.down_proj" => "ffn_down_shexp",
        _ => return None,
    };
    let unpermute_heads = match (arch, base) {
        (GgufArch::Llama, "attn_q") => Some(q_heads),
        (GgufArch::Llama, "attn_k") => Some(kv_heads),
        _ => None,
    };
    Some(Source::Tensor { name: blk(&format!("{base}.{kind}")), unpermute_heads })
}

/// The row order that restores Hugging Face's layout in each of `heads` heads of a q or k
/// projection of `rows` rows: row `a * head_dim / 2 + b` of a head comes from row `2 b + a`
/// (result row `i` is source row `order[i]`).
pub fn unpermute_order(rows: usize, heads: usize) -> Vec<usize> {
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut order: Vec<usize> = (0..rows).collect();
    for h in 0..heads {
        for a in 0..2 {
            for b in 0..half {
                order[h * head_dim + a * half + b] = h * head_dim + 2 * b + a;
            }
        }
    }
    order
}

/// `gate` and `up` (`[experts, inter, hidden]` each, row-major) as one `[experts, hidden,
/// 2 * inter]` tensor (see [`Source::ExpertsGateUp`]); `None` when a length disagrees.
pub fn experts_gate_up(gate: &[f32], up: &[f32], experts: usize, inter: usize, hidden: usize) -> Option<Vec<f32>> {
    let n = experts.checked_mul(inter)?.checked_mul(hidden)?;
    if gate.len() != n || up.len() != n {
        return None;
    }
    let mut out = vec![0.0; experts * hidden * 2 * inter];
    for e in 0..experts {
        for (half, src) in [gate, up].into_iter().enumerate() {
            for j in 0..inter {
                for c in 0..hidden {
                    out[(e * hidden + c) * 2 * inter + half * inter + j] = src[(e * inter + j) * hidden + c];
                }
            }
        }
    }
    Some(out)
}

/// Each expert's `[hidden, inter]` matrix of `down` transposed: `[experts, inter, hidden]`;
/// `None` when the length disagrees.
pub fn experts_down(down: &[f32], experts: usize, inter: usize, hidden: usize) -> Option<Vec<f32>> {
    if Some(down.len()) != experts.checked_mul(inter).and_then(|n| n.checked_mul(hidden)) {
        return None;
    }
    let mut out = vec![0.0; experts * inter * hidden];
    for e in 0..experts {
        for c in 0..hidden {
            for j in 0..inter {
                out[(e * inter + j) * hidden + c] = down[(e * hidden + c) * inter + j];
            }
        }
    }
    Some(out)
}
