//! The safe API: one call per op, the same on every target.
//!
//! Each call validates its arguments (dtypes, shapes, layouts, overlaps, scalar domains) and
//! returns a named [`Error`] before anything reaches a kernel; then it queues a
//! single launch. Outputs are passed as `&Tensor` views and written by the kernel.

pub mod attention;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;

pub use attention::{AttentionMask, AttentionOptions, AttentionWorkspace, Llama4Temperature, gqa_attention};
pub use rms_norm::{fused_add_rms_norm, rms_norm};
pub use rope::{Llama3Scaling, Rope, RopeConfig, RopeLayout};
pub use swiglu::{GateUp, swiglu};

/// Every kernel symbol the safe wrappers (and the self-tests) may load. A test checks that each
/// one exists in the PTX of both architectures and in the emulated registry.
pub fn kernel_symbols() -> Vec<crate::KernelRef> {
    rms_norm::kernel_symbols()
        .chain(rope::kernel_symbols())
        .chain(swiglu::kernel_symbols())
        .chain(attention::kernel_symbols())
        .chain(crate::selftest::kernel_symbols())
        .collect()
}

use crate::backend::KernelRef;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A family's kernels: the key a wrapper selects by (path, dtype, ...) and the symbol, which is
/// also the name in the PTX and in the emulated registry.
pub(crate) struct KernelTable<K: 'static> {
    pub module: &'static str,
    pub entries: &'static [(K, &'static str)],
}

impl<K: PartialEq + Copy> KernelTable<K> {
    /// Every symbol, for static checks.
    pub fn symbols(&'static self) -> impl Iterator<Item = KernelRef> {
        self.entries.iter().map(|(_, symbol)| KernelRef { module: self.module, symbol })
    }
    /// The kernel for `key`; a dtype without one is an [`Error::UnsupportedDType`].
    pub fn find(&self, op: &'static str, what: &'static str, key: K, dtype: DType) -> Result<KernelRef> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, symbol)| KernelRef { module: self.module, symbol })
            .ok_or(Error::UnsupportedDType { op, what, dtype, supported: "f32, f16, bf16" })
    }
}

/// A tensor seen as `rows` rows of `cols` contiguous elements, `row_stride` elements apart.
///
/// Every op addresses its tensors this way: the last dimension must be contiguous, and the
/// leading dimensions must collapse into one strided dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
}

impl Rows {
    /// Views `t` as rows of its last `inner_dims` dimensions (which must be contiguous together).
    pub fn of(op: &'static str, what: &'static str, t: &Tensor, inner_dims: usize) -> Result<Rows> {
        let (shape, strides) = (t.shape(), t.strides());
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        if shape.len() < inner_dims || inner_dims == 0 {
            return Err(Error::ShapeMismatch {
                op,
                what,
                got: shape.to_vec(),
                expected: format!("at least {inner_dims} dimension(s)"),
            });
        }
        let split = shape.len() - inner_dims;
        let cols: usize = shape[split..].iter().product();
        let rows: usize = shape[..split].iter().product();
        if cols > 1 || rows > 1 {
            // Inner dims: contiguous together (sizes of 1 may have any stride).
            let mut expect = 1usize;
            for d in (split..shape.len()).rev() {
                if shape[d] > 1 && strides[d] != expect {
                    return Err(bad("the innermost dimensions must be contiguous (last stride 1)"));
                }
                expect = expect.saturating_mul(shape[d]);
            }
        }
        // Outer dims: collapsible into one stride.
        let (_, row_stride) = collapse(&shape[..split], &strides[..split])
            .ok_or_else(|| bad("the leading dimensions must collapse into one row stride"))?;
        let row_stride = row_stride.unwrap_or(cols);
        if rows > 1 && row_stride < cols {
            return Err(bad("rows overlap (row stride smaller than the row)"));
        }
        Ok(Rows { offset: t.offset(), rows, cols, row_stride })
    }

    /// Whether some element of `self` shares memory with some element of `other` (both views of
    /// one storage, same element size). Exact when the row strides are equal, conservative
    /// (whole spans) otherwise.
    pub fn overlaps(&self, other: &Rows) -> bool {
        if self.rows == 0 || self.cols == 0 || other.rows == 0 || other.cols == 0 {
            return false;
        }
        let span = |r: &Rows| (r.offset, r.offset + (r.rows - 1) * r.row_stride + r.cols);
        let (a0, a1) = span(self);
        let (b0, b1) = span(other);
        if a1 <= b0 || b1 <= a0 {
            return false;
        }
        let s = self.row_stride as i128;
        if self.row_stride != other.row_stride || s == 0 || (self.rows == 1 && other.rows == 1) {
            return true;
        }
        // Row i of self is [o1 + i s, o1 + i s + c1); row j of other is [o2 + j s, ...). They
        // intersect iff m = i - j satisfies d - c1 < m s < d + c2 with d = o2 - o1.
        let d = other.offset as i128 - self.offset as i128;
        let (c1, c2) = (self.cols as i128, other.cols as i128);
        let lo = -(other.rows as i128 - 1);
        let hi = self.rows as i128 - 1;
        // Smallest m with m s > d - c1.
        let m_min = (d - c1).div_euclid(s) + 1;
        let m = m_min.max(lo);
        m <= hi && m * s < d + c2
    }
}

/// Collapses dimensions into one: `(count, stride)`, with `stride` None when at most one entry
/// exists. `None` when the dimensions are not evenly strided (sizes of 1 may have any stride).
fn collapse(shape: &[usize], strides: &[usize]) -> Option<(usize, Option<usize>)> {
    let mut stride = None;
    let mut expect_next: Option<usize> = None;
    for d in (0..shape.len()).rev() {
        if shape[d] == 1 {
            continue;
        }
        match expect_next {
            None => stride = Some(strides[d]),
            Some(e) if e != strides[d] => return None,
            Some(_) => {}
        }
        expect_next = Some(strides[d].checked_mul(shape[d])?);
    }
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    Some((count, if count > 1 { stride } else { None }))
}

/// A tensor seen as `[tokens, heads, head_dim]`: `head_dim` contiguous, any head stride, and
/// leading dimensions that collapse into one token stride (so `[batch, seq, heads, head_dim]`
/// and views into a fused QKV buffer work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    pub offset: usize,
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub token_stride: usize,
    pub head_stride: usize,
}

impl Heads {
    pub fn of(op: &'static str, what: &'static str, t: &Tensor) -> Result<Heads> {
        let (shape, strides) = (t.shape(), t.strides());
        if shape.len() < 3 {
            return Err(Error::ShapeMismatch {
                op,
                what,
                got: shape.to_vec(),
                expected: "[tokens, heads, head_dim] (or more leading dims)".into(),
            });
        }
        let r = shape.len();
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        if shape[r - 1] > 1 && strides[r - 1] != 1 {
            return Err(bad("head_dim must be contiguous (last stride 1)"));
        }
        let (tokens, token_stride) = collapse(&shape[..r - 2], &strides[..r - 2])
            .ok_or_else(|| bad("the leading dimensions must collapse into one token stride"))?;
        let (heads, head_dim) = (shape[r - 2], shape[r - 1]);
        let token_stride = token_stride.unwrap_or(heads * head_dim);
        let head_stride = if heads > 1 { strides[r - 2] } else { head_dim };
        // No two (token, head) rows may overlap: order the two strided dims by stride; the inner
        // one must step over a whole head, the outer one over all inner entries.
        let mut dims = [(token_stride, tokens), (head_stride, heads)];
        dims.sort();
        let [(s1, n1), (s2, n2)] = dims;
        if head_dim > 0 && ((n1 > 1 && s1 < head_dim) || (n2 > 1 && s2 < (n1.max(1) - 1) * s1 + head_dim)) {
            return Err(bad("(token, head) rows overlap: strides too small for head_dim"));
        }
        Ok(Heads { offset: t.offset(), tokens, heads, head_dim, token_stride, head_stride })
    }

    /// A row view for overlap checks: exact when the heads of a token are contiguous, else one
    /// conservative span.
    pub fn rows(&self) -> Rows {
        if self.head_stride == self.head_dim || self.heads <= 1 {
            Rows {
                offset: self.offset,
                rows: self.tokens,
                cols: self.heads * self.head_dim,
                row_stride: self.token_stride,
            }
        } else {
            let span = (self.tokens.max(1) - 1) * self.token_stride
                + (self.heads.max(1) - 1) * self.head_stride
                + self.head_dim;
            Rows { offset: self.offset, rows: 1, cols: span, row_stride: span }
        }
    }
}

/// Fails unless the two views are disjoint in memory.
pub(crate) fn check_disjoint(
    op: &'static str,
    a: (&'static str, &Tensor, &Rows),
    b: (&'static str, &Tensor, &Rows),
) -> Result<()> {
    if a.1.shares_storage(b.1) && a.2.overlaps(b.2) {
        return Err(Error::Overlap { op, a: a.0, b: b.0 });
    }
    Ok(())
}

pub(crate) fn check_float(op: &'static str, what: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(Error::UnsupportedDType { op, what, dtype: t.dtype(), supported: "f32, f16, bf16" });
    }
    Ok(())
}

pub(crate) fn check_dtype(op: &'static str, what: &'static str, t: &Tensor, expected: DType) -> Result<()> {
    if t.dtype() != expected {
        return Err(Error::DTypeMismatch { op, what, got: t.dtype(), expected });
    }
    Ok(())
}

pub(crate) fn check_shape(op: &'static str, what: &'static str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::ShapeMismatch { op, what, got: t.shape().to_vec(), expected: format!("{expected:?}") });
    }
    Ok(())
}

pub(crate) fn check_same_device(op: &'static str, first: &Tensor, others: &[(&'static str, &Tensor)]) -> Result<()> {
    for (what, t) in others {
        if !t.device().same(first.device()) {
            return Err(Error::DeviceMismatch { op, what });
        }
    }
    Ok(())
}

/// Grid dimension x for `n` blocks, checked against CUDA's limit.
pub(crate) fn grid_x(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| Error::invalid(op, "grid size", n, "exceeds 2^31-1 blocks"))
}

pub(crate) fn to_i64(op: &'static str, name: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(op, name, v, "does not fit in i64"))
}

#[cfg(test)]
mod tests {
    use super::Rows;

    fn rows(offset: usize, rows: usize, cols: usize, row_stride: usize) -> Rows {
        Rows { offset, rows, cols, row_stride }
    }

    /// Brute force: element sets intersect.
    fn brute(a: &Rows, b: &Rows) -> bool {
        let set = |r: &Rows| -> std::collections::HashSet<usize> {
            (0..r.rows).flat_map(|i| (0..r.cols).map(move |j| r.offset + i * r.row_stride + j)).collect()
        };
        !set(a).is_disjoint(&set(b))
    }

    #[test]
    fn overlap_is_exact_for_equal_strides() {
        // q/k/v column blocks of a fused [tokens, 3 * 8] buffer, and shifted variants.
        let cases = [
            (rows(0, 5, 8, 24), rows(8, 5, 8, 24)),
            (rows(0, 5, 9, 24), rows(8, 5, 8, 24)),
            (rows(16, 5, 8, 24), rows(0, 5, 8, 24)),
            (rows(16, 5, 9, 24), rows(0, 5, 8, 24)),
            (rows(0, 1, 8, 24), rows(24, 1, 8, 24)),
            (rows(0, 3, 8, 8), rows(24, 3, 8, 8)),
            (rows(0, 4, 8, 8), rows(24, 3, 8, 8)),
            (rows(3, 7, 5, 11), rows(0, 9, 6, 11)),
        ];
        for (a, b) in cases {
            assert_eq!(a.overlaps(&b), brute(&a, &b), "{a:?} vs {b:?}");
            assert_eq!(b.overlaps(&a), brute(&a, &b), "{b:?} vs {a:?}");
        }
        // Exhaustive small sweep.
        for o2 in 0..30 {
            for c1 in 1..6 {
                for c2 in 1..6 {
                    let (a, b) = (rows(2, 3, c1, 7), rows(o2, 4, c2, 7));
                    assert_eq!(a.overlaps(&b), brute(&a, &b), "{a:?} vs {b:?}");
                }
            }
        }
    }
}
