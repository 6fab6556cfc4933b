//! A paged KV pool `[num_pages, page_size, kv_heads, head_dim]` as the kernels address it, and
//! the block-table checks the paged ops share.

use super::args::Arg;
use super::layout::Rows;
use super::validate::{check_disjoint, check_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A page pool as the kernels address it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pool {
    pub addr: u64,
    pub dtype: DType,
    pub num_pages: usize,
    pub page_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub page_stride: usize,
}

impl Pool {
    pub fn of(op: &'static str, what: &'static str, b: &Arg) -> Result<Pool> {
        let (shape, strides) = (b.shape(), b.strides());
        if shape.len() != 4 {
            return Err(Error::shape(op, what, shape.to_vec(), "[num_pages, page_size, kv_heads, head_dim]"));
        }
        let (num_pages, page_size, kv_heads, head_dim) = (shape[0], shape[1], shape[2], shape[3]);
        let page_elems = page_size
            .checked_mul(kv_heads)
            .and_then(|x| x.checked_mul(head_dim))
            .ok_or_else(|| Error::TooLarge { what, shape: shape.to_vec() })?;
        if page_elems >= 1 << 31 {
            return Err(Error::invalid(op, "page elements", page_elems, "must be < 2^31"));
        }
        if !page_size.is_power_of_two() {
            return Err(Error::invalid(op, "page_size", page_size, "must be a power of two (16, 32, 64, 128, ...)"));
        }
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        // Each page [page_size, kv_heads, head_dim] contiguous (unit dims may have any stride).
        let mut expect = 1usize;
        for d in (1..4).rev() {
            if shape[d] > 1 && strides[d] != expect {
                return Err(bad("each page [page_size, kv_heads, head_dim] must be contiguous"));
            }
            expect *= shape[d];
        }
        let page_stride = if num_pages > 1 { strides[0] } else { page_elems };
        if num_pages > 1 && page_stride < page_elems && page_elems > 0 {
            return Err(bad("pages overlap (page stride smaller than a page)"));
        }
        Ok(Pool { addr: b.addr, dtype: b.dtype, num_pages, page_size, kv_heads, head_dim, page_stride })
    }
    pub fn rows(&self) -> Rows {
        let cols = self.page_size * self.kv_heads * self.head_dim;
        Rows {
            addr: self.addr,
            elem: self.dtype.size(),
            rows: self.num_pages,
            cols,
            row_stride: self.page_stride.max(cols),
        }
    }
    pub fn check_aligned(&self, op: &'static str, what: &'static str) -> Result<()> {
        let e = self.dtype.size();
        if self.addr % 16 != 0 || (self.page_stride * e) % 16 != 0 || (self.head_dim * e) % 16 != 0 {
            return Err(Error::BadLayout {
                op,
                what,
                shape: vec![self.num_pages, self.page_size, self.kv_heads, self.head_dim],
                strides: vec![self.page_stride, self.kv_heads * self.head_dim, self.head_dim, 1],
                why: "pages and rows must be 16-byte aligned (address, page stride, head_dim bytes)",
            });
        }
        Ok(())
    }
}

/// Checks that K and V pools match and returns K's.
pub(crate) fn check_pools(op: &'static str, k: &Pool, v: &Pool) -> Result<()> {
    if v.dtype != k.dtype {
        return Err(Error::DTypeMismatch { op, what: "v_pages", got: v.dtype, expected: k.dtype });
    }
    if (v.num_pages, v.page_size, v.kv_heads, v.head_dim) != (k.num_pages, k.page_size, k.kv_heads, k.head_dim) {
        return Err(Error::shape(
            op,
            "v_pages",
            vec![v.num_pages, v.page_size, v.kv_heads, v.head_dim],
            format!("{:?} like k_pages", [k.num_pages, k.page_size, k.kv_heads, k.head_dim]),
        ));
    }
    if k.kv_heads == 0 {
        return Err(Error::invalid(op, "kv_heads", 0, "must be > 0"));
    }
    check_disjoint(op, ("k_pages", k.rows()), ("v_pages", v.rows()))
}

/// Checks a block table `[batch, max_pages]` i32 (last dim contiguous) and returns
/// `(max_pages, row stride)`.
pub(crate) fn check_block_table(op: &'static str, b: &Arg, batch: usize) -> Result<(usize, usize)> {
    check_dtype(op, "block_table", b.dtype, DType::I32)?;
    let shape = b.shape();
    if shape.len() != 2 || shape[0] != batch {
        return Err(Error::shape(
            op,
            "block_table",
            shape.to_vec(),
            format!("[{batch}, max_pages] (batch, pages per sequence)"),
        ));
    }
    let strides = b.strides();
    if shape[1] > 1 && strides[1] != 1 {
        return Err(Error::BadLayout {
            op,
            what: "block_table",
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: "rows must be contiguous",
        });
    }
    let row_stride = if batch > 1 { strides[0] } else { shape[1] };
    Ok((shape[1], row_stride))
}

/// A block table as rows (for the overlap checks).
pub(crate) fn table_rows(b: &Arg, max_pages: usize, stride: usize) -> Rows {
    Rows { addr: b.addr, elem: 4, rows: b.shape()[0], cols: max_pages, row_stride: stride.max(max_pages) }
}
