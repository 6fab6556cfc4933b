//! How a kernel sees a view: as strided rows ([`Rows`]) or as `[tokens, heads, head_dim]` rows
//! ([`Heads`]), and the exact overlap test between two such regions ([`Region::overlaps`]), in
//! byte lattices that cannot overflow.

use super::args::Arg;
use crate::error::{Error, Result};
use crate::tensor::numel;

/// A view seen as `rows` rows of `cols` contiguous elements, `row_stride` elements apart.
///
/// Every op addresses its tensors this way: the last dimension must be contiguous, and the
/// leading dimensions must collapse into one strided dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    /// Device address of the first element.
    pub addr: u64,
    pub elem: usize,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
}

impl Rows {
    /// Views `b` as rows of its last `inner_dims` dimensions (which must be contiguous together).
    /// Any empty view is accepted (0 rows or 0 columns).
    pub fn of(op: &'static str, what: &'static str, b: &Arg, inner_dims: usize) -> Result<Rows> {
        let (shape, strides) = (b.shape(), b.strides());
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        if shape.len() < inner_dims || inner_dims == 0 {
            return Err(Error::shape(op, what, shape.to_vec(), format!("at least {inner_dims} dimension(s)")));
        }
        let too_large = || Error::TooLarge { what, shape: shape.to_vec() };
        let split = shape.len() - inner_dims;
        let cols = numel(&shape[split..]).ok_or_else(too_large)?;
        let rows = numel(&shape[..split]).ok_or_else(too_large)?;
        if rows == 0 || cols == 0 {
            return Ok(Rows { addr: b.addr, elem: b.dtype.size(), rows, cols, row_stride: cols });
        }
        // Inner dims: contiguous together (sizes of 1 may have any stride).
        let mut expect = 1usize;
        for d in (split..shape.len()).rev() {
            if shape[d] > 1 && strides[d] != expect {
                return Err(bad("the innermost dimensions must be contiguous (last stride 1)"));
            }
            expect = expect.saturating_mul(shape[d]);
        }
        // Outer dims: collapsible into one stride.
        let (_, row_stride) = collapse(&shape[..split], &strides[..split])
            .ok_or_else(|| bad("the leading dimensions must collapse into one row stride"))?;
        let row_stride = row_stride.unwrap_or(cols);
        if rows > 1 && row_stride < cols {
            return Err(bad("rows overlap (row stride smaller than the row)"));
        }
        Ok(Rows { addr: b.addr, elem: b.dtype.size(), rows, cols, row_stride })
    }

    fn lattice(&self) -> Lattice {
        let e = self.elem as i128;
        Lattice {
            addr: self.addr as i128,
            n1: self.rows as i128,
            s1: self.row_stride as i128 * e,
            n2: 1,
            s2: 0,
            width: self.cols as i128 * e,
        }
        .normalized()
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
    let count = numel(shape)?;
    Some((count, if count > 1 { stride } else { None }))
}

/// A view seen as `[tokens, heads, head_dim]`: `head_dim` contiguous, any head stride, and
/// leading dimensions that collapse into one token stride (so `[batch, seq, heads, head_dim]`
/// and views into a fused QKV buffer work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    pub addr: u64,
    pub elem: usize,
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub token_stride: usize,
    pub head_stride: usize,
}

impl Heads {
    pub fn of(op: &'static str, what: &'static str, b: &Arg) -> Result<Heads> {
        let (shape, strides) = (b.shape(), b.strides());
        if shape.len() < 3 {
            return Err(Error::shape(op, what, shape.to_vec(), "[tokens, heads, head_dim] (or more leading dims)"));
        }
        let r = shape.len();
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        let (heads, head_dim) = (shape[r - 2], shape[r - 1]);
        let tokens = numel(&shape[..r - 2]).ok_or_else(|| Error::TooLarge { what, shape: shape.to_vec() })?;
        let elem = b.dtype.size();
        if tokens == 0 || heads == 0 || head_dim == 0 {
            // Empty: any strides (an empty view has none that matter).
            // Unused strides: saturate rather than fail, so that every empty view is accepted.
            let row = heads.saturating_mul(head_dim);
            return Ok(Heads { addr: b.addr, elem, tokens, heads, head_dim, token_stride: row, head_stride: head_dim });
        }
        if head_dim > 1 && strides[r - 1] != 1 {
            return Err(bad("head_dim must be contiguous (last stride 1)"));
        }
        let (_, token_stride) = collapse(&shape[..r - 2], &strides[..r - 2])
            .ok_or_else(|| bad("the leading dimensions must collapse into one token stride"))?;
        let token_stride = token_stride.unwrap_or(heads * head_dim);
        let head_stride = if heads > 1 { strides[r - 2] } else { head_dim };
        // No two (token, head) rows may overlap: order the two strided dims by stride; the inner
        // one must step over a whole head, the outer one over all inner entries.
        let mut dims = [(token_stride, tokens), (head_stride, heads)];
        dims.sort();
        let [(s1, n1), (s2, n2)] = dims;
        let inner_span = (n1 - 1).checked_mul(s1).and_then(|x| x.checked_add(head_dim));
        if (n1 > 1 && s1 < head_dim) || (n2 > 1 && inner_span.is_none_or(|span| s2 < span)) {
            return Err(bad("(token, head) rows overlap: strides too small for head_dim"));
        }
        Ok(Heads { addr: b.addr, elem, tokens, heads, head_dim, token_stride, head_stride })
    }

    /// Every `head_dim` row starts 16-byte aligned (address and both strides), as the 16-byte
    /// vector and cp.async paths need.
    pub fn check_rows_aligned(&self, op: &'static str, what: &'static str) -> Result<()> {
        let v16 = 16 / self.elem.max(1);
        if self.addr % 16 != 0 || self.token_stride % v16 != 0 || self.head_stride % v16 != 0 {
            return Err(Error::BadLayout {
                op,
                what,
                shape: vec![self.tokens, self.heads, self.head_dim],
                strides: vec![self.token_stride, self.head_stride, 1],
                why: "rows must be 16-byte aligned (address and strides)",
            });
        }
        Ok(())
    }

    fn lattice(&self) -> Lattice {
        let e = self.elem as i128;
        Lattice {
            addr: self.addr as i128,
            n1: self.tokens as i128,
            s1: self.token_stride as i128 * e,
            n2: self.heads as i128,
            s2: self.head_stride as i128 * e,
            width: self.head_dim as i128 * e,
        }
        .normalized()
    }
}

/// A memory region an op reads or writes: rows, or `[tokens, heads, head_dim]` rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Region {
    Rows(Rows),
    Heads(Heads),
}

impl From<Rows> for Region {
    fn from(r: Rows) -> Self {
        Region::Rows(r)
    }
}
impl From<Heads> for Region {
    fn from(h: Heads) -> Self {
        Region::Heads(h)
    }
}

impl Region {
    fn lattice(&self) -> Lattice {
        match self {
            Region::Rows(r) => r.lattice(),
            Region::Heads(h) => h.lattice(),
        }
    }
    /// Whether some byte of `self` is also a byte of `other`. Exact for views that share their
    /// strides (q, k and v of one fused buffer, with contiguous or strided heads) and for views
    /// with few rows; conservative (whole spans) only for large views with unrelated strides.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.lattice().overlaps(&other.lattice())
    }
}

/// Bytes `{addr + i s1 + j s2 + x : i < n1, j < n2, x < width}`, in i128 so nothing overflows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lattice {
    addr: i128,
    n1: i128,
    s1: i128,
    n2: i128,
    s2: i128,
    width: i128,
}

/// Row-count product up to which two lattices with unrelated strides are compared row by row.
const EXACT_ROWS: i128 = 1 << 14;

impl Lattice {
    fn is_empty(&self) -> bool {
        self.n1 == 0 || self.n2 == 0 || self.width == 0
    }
    /// Canonical form: unit dimensions drop their stride, contiguous inner rows merge into the
    /// width, and the larger stride is s1.
    fn normalized(mut self) -> Lattice {
        if self.n2 == 1 {
            self.s2 = 0;
        }
        if self.n1 == 1 {
            self.s1 = 0;
        }
        if self.n2 > 1 && self.s2 == self.width {
            self.width *= self.n2;
            (self.n2, self.s2) = (1, 0);
        }
        if self.n1 > 1 && self.n2 == 1 && self.s1 == self.width {
            self.width *= self.n1;
            (self.n1, self.s1) = (1, 0);
        }
        if self.s2 > self.s1 {
            (self.n1, self.s1, self.n2, self.s2) = (self.n2, self.s2, self.n1, self.s1);
        }
        if self.n2 == 1 && self.n1 == 1 {
            (self.s1, self.s2) = (0, 0);
        }
        self
    }
    fn span(&self) -> (i128, i128) {
        (self.addr, self.addr + (self.n1 - 1) * self.s1 + (self.n2 - 1) * self.s2 + self.width)
    }
    fn rows(&self) -> i128 {
        self.n1 * self.n2
    }
    /// The `k`-th row, as a lattice of one row.
    fn row(&self, k: i128) -> Lattice {
        let (i, j) = (k / self.n2, k % self.n2);
        Lattice { addr: self.addr + i * self.s1 + j * self.s2, n1: 1, s1: 0, n2: 1, s2: 0, width: self.width }
    }
    fn overlaps(&self, other: &Lattice) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        let ((a0, a1), (b0, b1)) = (self.span(), other.span());
        if a1 <= b0 || b1 <= a0 {
            return false;
        }
        let compatible = |a: &Lattice, b: &Lattice| {
            (a.n1 == 1 || b.n1 == 1 || a.s1 == b.s1) && (a.n2 == 1 || b.n2 == 1 || a.s2 == b.s2)
        };
        if compatible(self, other) {
            let s1 = if self.n1 > 1 { self.s1 } else { other.s1 };
            let s2 = if self.n2 > 1 { self.s2 } else { other.s2 };
            if let Some(hit) = self.overlaps_same_strides(other, s1, s2) {
                return hit;
            }
        }
        // Unrelated strides: compare the smaller lattice's rows one by one.
        let (few, many) = if self.rows() <= other.rows() { (self, other) } else { (other, self) };
        if few.rows() <= EXACT_ROWS {
            return (0..few.rows()).any(|k| {
                let r = few.row(k);
                r.overlaps_same_strides(many, many.s1, many.s2).unwrap_or(true)
            });
        }
        true
    }
    /// Exact test for lattices sharing (s1, s2): is there m, n with
    /// `D + m s1 + n s2` in `[-(wa - 1), wb - 1]`, `D = a.addr - b.addr`? `None` if the search
    /// would take too long.
    fn overlaps_same_strides(&self, other: &Lattice, s1: i128, s2: i128) -> Option<bool> {
        let d = self.addr - other.addr;
        let (lo, hi) = (-(self.width - 1), other.width - 1);
        let (m_lo, m_hi) = (-(other.n1 - 1), self.n1 - 1);
        let (n_lo, n_hi) = (-(other.n2 - 1), self.n2 - 1);
        // For a fixed m, the feasible n form an interval (s2 > 0), or n is free (s2 == 0).
        let feasible = |m: i128| -> bool {
            let base = d + m * s1;
            if s2 == 0 || n_lo == n_hi {
                let v = base + n_lo * s2;
                return lo <= v && v <= hi;
            }
            let first = (lo - base).div_euclid(s2) + i128::from((lo - base).rem_euclid(s2) != 0);
            let last = (hi - base).div_euclid(s2);
            first.max(n_lo) <= last.min(n_hi)
        };
        if s1 == 0 || m_lo == m_hi {
            return Some(feasible(m_lo));
        }
        // Only m with |base| within the reach of n s2 and the widths can work.
        let reach = (n_hi - n_lo) * s2.abs() + self.width + other.width;
        let first = ((-d - reach).div_euclid(s1)).max(m_lo);
        let last = ((-d + reach).div_euclid(s1) + 1).min(m_hi);
        if last - first > EXACT_ROWS {
            return None;
        }
        Some((first..=last).any(feasible))
    }
}

#[cfg(test)]
mod tests {
    use super::{Heads, Region, Rows};

    fn rows(offset: usize, rows: usize, cols: usize, row_stride: usize) -> Rows {
        Rows { addr: offset as u64, elem: 1, rows, cols, row_stride }
    }
    fn heads(offset: usize, t: usize, h: usize, d: usize, ts: usize, hs: usize) -> Heads {
        Heads { addr: offset as u64, elem: 1, tokens: t, heads: h, head_dim: d, token_stride: ts, head_stride: hs }
    }

    fn bytes(r: &Region) -> std::collections::HashSet<i128> {
        let l = r.lattice();
        let mut s = std::collections::HashSet::new();
        for i in 0..l.n1 {
            for j in 0..l.n2 {
                for x in 0..l.width {
                    s.insert(l.addr + i * l.s1 + j * l.s2 + x);
                }
            }
        }
        s
    }
    fn brute(a: &Region, b: &Region) -> bool {
        !bytes(a).is_disjoint(&bytes(b))
    }

    #[test]
    fn overlap_is_exact_for_equal_strides() {
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
            let (a, b) = (Region::Rows(a), Region::Rows(b));
            assert_eq!(a.overlaps(&b), brute(&a, &b), "{a:?} vs {b:?}");
            assert_eq!(b.overlaps(&a), brute(&a, &b), "{b:?} vs {a:?}");
        }
        for o2 in 0..30 {
            for c1 in 1..6 {
                for c2 in 1..6 {
                    let (a, b) = (Region::Rows(rows(2, 3, c1, 7)), Region::Rows(rows(o2, 4, c2, 7)));
                    assert_eq!(a.overlaps(&b), brute(&a, &b), "{a:?} vs {b:?}");
                }
            }
        }
    }

    #[test]
    fn overlap_is_exact_for_neox_fused_qkv_heads() {
        // GPT-NeoX fused QKV [t, h, 3, d]: q, k, v are [t, h, d] views with head stride 3d.
        let (t, h, d) = (5, 4, 8);
        let q = Region::Heads(heads(0, t, h, d, h * 3 * d, 3 * d));
        let k = Region::Heads(heads(d, t, h, d, h * 3 * d, 3 * d));
        let v = Region::Heads(heads(2 * d, t, h, d, h * 3 * d, 3 * d));
        for (a, b) in [(&q, &k), (&k, &v), (&q, &v)] {
            assert!(!a.overlaps(b), "{a:?} vs {b:?}");
        }
        let k_shifted = Region::Heads(heads(d - 1, t, h, d, h * 3 * d, 3 * d));
        assert!(q.overlaps(&k_shifted));
    }

    #[test]
    fn overlap_matches_brute_force_on_a_sweep() {
        let mut state = 7u64;
        for _ in 0..3000 {
            let mut r = |n: u64| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % n) as usize
            };
            let mk = |r: &mut dyn FnMut(u64) -> usize| {
                let d = 1 + r(4);
                let h = 1 + r(3);
                let hs = d + r(6);
                let t = 1 + r(4);
                let ts = if r(2) == 0 { (h - 1) * hs + d + r(8) } else { d + r(3) };
                if r(3) == 0 {
                    Region::Rows(rows(r(40), t, d, d.max(ts)))
                } else {
                    Region::Heads(heads(r(40), t, h, d, ts, hs))
                }
            };
            let (a, b) = (mk(&mut r), mk(&mut r));
            // Only views that do not overlap themselves are valid inputs.
            let self_ok = |x: &Region| {
                bytes(x).len() as i128 == {
                    let l = x.lattice();
                    l.n1 * l.n2 * l.width
                }
            };
            if !self_ok(&a) || !self_ok(&b) {
                continue;
            }
            assert_eq!(a.overlaps(&b), brute(&a, &b), "{a:?} vs {b:?}");
        }
    }
}
