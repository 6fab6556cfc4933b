//! Borrowed views: the layer every op is built on.
//!
//! A [`TensorView`] (read) or [`TensorViewMut`] (write) is a dtype, a shape, strides and an
//! offset over memory the caller owns: a cudarc buffer (`CudaSlice`, `CudaView`, `CudaViewMut`
//! of f32, f16, bf16, i32, i64, or untyped `u8` with an explicit dtype), a host slice (the
//! emulated target's memory is host memory), or a [`Tensor`] of this crate. Nothing is copied
//! and nothing is taken over; the borrow checker keeps the buffer alive and, for outputs,
//! exclusive for as long as the view lives.
//!
//! ```
//! use llama_kernels::{Device, TensorView, TensorViewMut, ops};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::emulated(); // a CUDA engine passes its stream: `ops::rms_norm_on(&stream, ...)`
//! let (rows, hidden) = (2, 64);
//! let x: Vec<f32> = (0..rows * hidden).map(|i| (i as f32).sin()).collect();
//! let w = vec![1.0f32; hidden];
//! let mut y = vec![0.0f32; rows * hidden];
//! let (xv, wv) = (TensorView::host(&x, &[rows, hidden])?, TensorView::host(&w, &[hidden])?);
//! let mut yv = TensorViewMut::host(&mut y, &[rows, hidden])?;
//! ops::rms_norm_on(&device, Some(&xv), &wv, 1e-5, &mut yv)?;
//! # Ok(())
//! # }
//! ```

use std::marker::PhantomData;

pub use crate::backend::borrowed::{CudaRead, CudaWrite};
use crate::backend::borrowed::{ReadSrc, WriteSrc};
use crate::backend::storage::Storage;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// Most dimensions a view (or tensor) may have.
pub const MAX_RANK: usize = 8;

/// Shape, strides (in elements) and offset (in elements), inline: creating a view allocates
/// nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    rank: u8,
    shape: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    offset: usize,
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} strides {:?} offset {}", self.shape(), self.strides(), self.offset)
    }
}

impl Dims {
    /// Checks the rank; an empty view is normalized to zero strides and offset 0.
    pub(crate) fn new(what: &'static str, shape: &[usize], strides: &[usize], offset: usize) -> Result<Dims> {
        if shape.len() > MAX_RANK {
            return Err(Error::RankTooLarge { what, rank: shape.len(), max: MAX_RANK });
        }
        if shape.len() != strides.len() {
            return Err(Error::InvalidView {
                what,
                why: format!("shape {shape:?} and strides {strides:?} differ in rank"),
            });
        }
        let mut d = Dims { rank: shape.len() as u8, shape: [0; MAX_RANK], strides: [0; MAX_RANK], offset };
        d.shape[..shape.len()].copy_from_slice(shape);
        if numel(shape) == Some(0) {
            d.offset = 0;
        } else {
            d.strides[..strides.len()].copy_from_slice(strides);
        }
        Ok(d)
    }
    /// Row-major strides for `shape`, offset 0.
    pub(crate) fn contiguous(what: &'static str, shape: &[usize]) -> Result<Dims> {
        let strides = contiguous_strides(shape).ok_or_else(|| Error::TooLarge { what, shape: shape.to_vec() })?;
        Self::new(what, shape, &strides[..shape.len()], 0)
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.rank as usize]
    }
    /// Entries `[start, start + len)` of dimension `dim`, the same memory (checked against the
    /// dimension; the offset may not overflow).
    pub(crate) fn narrow(&self, what: &'static str, dim: usize, start: usize, len: usize) -> Result<Dims> {
        let size = *self.shape().get(dim).ok_or_else(|| Error::InvalidView {
            what,
            why: format!("dim {dim} out of range for rank {}", self.rank()),
        })?;
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::InvalidView {
                what,
                why: format!("{start}..{start}+{len} exceeds dim {dim} of size {size}"),
            });
        }
        let mut shape = self.shape().to_vec();
        shape[dim] = len;
        let offset = start.checked_mul(self.strides()[dim]).and_then(|o| o.checked_add(self.offset));
        let offset =
            offset.ok_or_else(|| Error::InvalidView { what, why: format!("the offset of {start} overflows") })?;
        Dims::new(what, &shape, self.strides(), offset)
    }
    /// The same layout with the last dimension resized (a column range of rows).
    pub(crate) fn with_last(mut self, len: usize) -> Dims {
        if self.rank > 0 {
            self.shape[self.rank as usize - 1] = len;
        }
        self
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank as usize]
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.rank as usize
    }
    /// Element count (checked: a shape whose product overflows is rejected at creation).
    pub fn numel(&self) -> usize {
        numel(self.shape()).unwrap_or(usize::MAX)
    }
    pub fn is_contiguous(&self) -> bool {
        let n = self.numel();
        if n <= 1 {
            return true;
        }
        let mut expect = 1usize;
        for d in (0..self.rank()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expect {
                return false;
            }
            expect = expect.saturating_mul(self.shape[d]);
        }
        true
    }
    /// Elements spanned in memory, `[first, last]` inclusive, or `None` when empty. Checked: a
    /// layout whose span overflows is an error.
    pub(crate) fn span(&self, what: &'static str) -> Result<Option<(usize, usize)>> {
        let n = numel(self.shape()).ok_or_else(|| Error::TooLarge { what, shape: self.shape().to_vec() })?;
        if n == 0 {
            return Ok(None);
        }
        let last = self
            .shape()
            .iter()
            .zip(self.strides())
            .try_fold(self.offset, |acc, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x)))
            .ok_or_else(|| Error::InvalidView { what, why: format!("layout {self:?} overflows") })?;
        Ok(Some((self.offset, last)))
    }
    /// Fails unless every element lies inside `bytes` bytes of memory of `dtype` elements.
    pub(crate) fn check_fits(&self, what: &'static str, dtype: DType, bytes: usize) -> Result<()> {
        if let Some((_, last)) = self.span(what)? {
            let end = last.checked_add(1).and_then(|e| e.checked_mul(dtype.size()));
            if end.is_none_or(|e| e > bytes) {
                return Err(Error::InvalidView {
                    what,
                    why: format!("{dtype} view {self:?} exceeds its {bytes}-byte buffer"),
                });
            }
        }
        Ok(())
    }
}

/// Product of the dimensions, or `None` on overflow.
pub(crate) fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Row-major strides of a shape, or `None` when a stride overflows (an empty shape with huge
/// dimensions gets zero strides: they are never used).
pub fn contiguous_strides(shape: &[usize]) -> Option<Vec<usize>> {
    if numel(shape) == Some(0) {
        return Some(vec![0; shape.len()]);
    }
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].checked_mul(shape[i + 1])?;
    }
    Some(strides)
}

/// A borrowed, read-only strided view of device memory (see the module docs).
#[derive(Clone)]
pub struct TensorView<'a> {
    src: ReadSrc<'a>,
    dtype: DType,
    dims: Dims,
    _borrow: PhantomData<&'a [u8]>,
}

/// A borrowed, writable strided view of device memory (see the module docs).
pub struct TensorViewMut<'a> {
    src: WriteSrc<'a>,
    dtype: DType,
    dims: Dims,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl std::fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorView({} {:?})", self.dtype, self.dims)
    }
}
impl std::fmt::Debug for TensorViewMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorViewMut({} {:?})", self.dtype, self.dims)
    }
}

fn typed_dtype(what: &'static str, found: Option<DType>) -> Result<DType> {
    found.ok_or_else(|| Error::InvalidView {
        what,
        why: "an untyped u8 buffer needs an explicit dtype (use the `_bytes` constructor)".into(),
    })
}

impl<'a> TensorView<'a> {
    /// A contiguous view of a typed cudarc buffer, from its first element.
    pub fn cuda<B: CudaRead>(buf: &'a B, shape: &[usize]) -> Result<Self> {
        let dtype = typed_dtype("TensorView::cuda", buf.elem_dtype())?;
        Self::cuda_strided_bytes(buf, dtype, Dims::contiguous("TensorView::cuda", shape)?)
    }
    /// A strided view of a typed cudarc buffer (strides and offset in elements).
    pub fn cuda_strided<B: CudaRead>(buf: &'a B, shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        let dtype = typed_dtype("TensorView::cuda_strided", buf.elem_dtype())?;
        Self::cuda_strided_bytes(buf, dtype, Dims::new("TensorView::cuda_strided", shape, strides, offset)?)
    }
    /// A contiguous view of `dtype` elements over any cudarc buffer (u8 bytes included).
    pub fn cuda_bytes<B: CudaRead>(buf: &'a B, dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::cuda_strided_bytes(buf, dtype, Dims::contiguous("TensorView::cuda_bytes", shape)?)
    }
    fn cuda_strided_bytes<B: CudaRead>(buf: &'a B, dtype: DType, dims: Dims) -> Result<Self> {
        if buf.elem_dtype().is_some_and(|d| d != dtype) {
            return Err(Error::DTypeMismatch {
                op: "TensorView",
                what: "buffer",
                got: buf.elem_dtype().unwrap_or(dtype),
                expected: dtype,
            });
        }
        dims.check_fits("TensorView", dtype, buf.byte_len())?;
        Ok(TensorView { src: ReadSrc::Cuda(buf), dtype, dims, _borrow: PhantomData })
    }
    /// A contiguous view of a host slice: device memory of the emulated target.
    pub fn host<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Self> {
        Self::host_strided(data, shape, &contiguous_strides(shape).unwrap_or_default(), 0)
    }
    /// A strided view of a host slice (emulated target).
    pub fn host_strided<T: Element>(data: &'a [T], shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        let dims = Dims::new("TensorView::host", shape, strides, offset)?;
        dims.check_fits("TensorView::host", T::DTYPE, std::mem::size_of_val(data))?;
        Ok(TensorView { src: ReadSrc::Host(data.as_ptr() as u64), dtype: T::DTYPE, dims, _borrow: PhantomData })
    }
    /// A view of storage owned by this crate (a tensor's).
    pub(crate) fn of_storage(storage: &'a Storage, dtype: DType, dims: Dims) -> Self {
        TensorView { src: ReadSrc::Storage(storage), dtype, dims, _borrow: PhantomData }
    }
    /// The same memory with another layout (checked against the buffer's size where known).
    pub fn with_layout(self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        let dims = Dims::new("TensorView::with_layout", shape, strides, offset)?;
        if let Some(bytes) = self.known_bytes() {
            dims.check_fits("TensorView::with_layout", self.dtype, bytes)?;
        }
        Ok(TensorView { dims, ..self })
    }
    /// Rows `[start, start + len)` of the first dimension, as a view of the same memory.
    pub(crate) fn narrow_rows(&self, what: &'static str, start: usize, len: usize) -> Result<TensorView<'a>> {
        Ok(TensorView { dims: self.dims.narrow(what, 0, start, len)?, ..self.clone() })
    }
    fn known_bytes(&self) -> Option<usize> {
        match &self.src {
            ReadSrc::Storage(s) => Some(s.bytes()),
            ReadSrc::Cuda(c) => Some(c.byte_len()),
            ReadSrc::Host(_) => None,
        }
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The size of each dimension, outermost first.
    pub fn shape(&self) -> &[usize] {
        self.dims.shape()
    }
    /// Strides in elements (all 0 for an empty view).
    pub fn strides(&self) -> &[usize] {
        self.dims.strides()
    }
    /// Offset of the first element from the start of the buffer or slice, in elements.
    pub fn offset(&self) -> usize {
        self.dims.offset()
    }
    /// The number of elements (the product of the shape).
    pub fn numel(&self) -> usize {
        self.dims.numel()
    }
    pub(crate) fn dims(&self) -> &Dims {
        &self.dims
    }
    pub(crate) fn src(&self) -> &ReadSrc<'a> {
        &self.src
    }
}

impl<'a> TensorViewMut<'a> {
    /// A contiguous writable view of a typed cudarc buffer, from its first element.
    pub fn cuda<B: CudaWrite>(buf: &'a mut B, shape: &[usize]) -> Result<Self> {
        let dtype = typed_dtype("TensorViewMut::cuda", buf.elem_dtype())?;
        Self::cuda_dims(buf, dtype, Dims::contiguous("TensorViewMut::cuda", shape)?)
    }
    /// A strided writable view of a typed cudarc buffer (strides and offset in elements).
    pub fn cuda_strided<B: CudaWrite>(
        buf: &'a mut B,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        let dtype = typed_dtype("TensorViewMut::cuda_strided", buf.elem_dtype())?;
        Self::cuda_dims(buf, dtype, Dims::new("TensorViewMut::cuda_strided", shape, strides, offset)?)
    }
    /// A contiguous writable view of `dtype` elements over any cudarc buffer (u8 bytes included).
    pub fn cuda_bytes<B: CudaWrite>(buf: &'a mut B, dtype: DType, shape: &[usize]) -> Result<Self> {
        Self::cuda_dims(buf, dtype, Dims::contiguous("TensorViewMut::cuda_bytes", shape)?)
    }
    fn cuda_dims<B: CudaWrite>(buf: &'a mut B, dtype: DType, dims: Dims) -> Result<Self> {
        if let Some(d) = buf.elem_dtype().filter(|&d| d != dtype) {
            return Err(Error::DTypeMismatch { op: "TensorViewMut", what: "buffer", got: d, expected: dtype });
        }
        dims.check_fits("TensorViewMut", dtype, buf.byte_len())?;
        Ok(TensorViewMut { src: WriteSrc::Cuda(buf), dtype, dims, _borrow: PhantomData })
    }
    /// A contiguous writable view of a host slice: device memory of the emulated target.
    pub fn host<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        Self::host_strided(data, shape, &contiguous_strides(shape).unwrap_or_default(), 0)
    }
    /// A strided writable view of a host slice (emulated target).
    pub fn host_strided<T: Element>(
        data: &'a mut [T],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        let dims = Dims::new("TensorViewMut::host", shape, strides, offset)?;
        dims.check_fits("TensorViewMut::host", T::DTYPE, std::mem::size_of_val(data))?;
        Ok(TensorViewMut { src: WriteSrc::Host(data.as_mut_ptr() as u64), dtype: T::DTYPE, dims, _borrow: PhantomData })
    }
    /// A writable view of a tensor. Crate-private: `Tensor` is a shared handle, so the Tensor
    /// API checks aliasing itself before it hands views to the ops.
    /// A writable view of storage owned by this crate (a tensor's).
    pub(crate) fn of_storage(storage: &'a Storage, dtype: DType, dims: Dims) -> Self {
        TensorViewMut { src: WriteSrc::Storage(storage), dtype, dims, _borrow: PhantomData }
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The size of each dimension, outermost first.
    pub fn shape(&self) -> &[usize] {
        self.dims.shape()
    }
    /// Strides in elements (all 0 for an empty view).
    pub fn strides(&self) -> &[usize] {
        self.dims.strides()
    }
    /// Offset of the first element from the start of the buffer or slice, in elements.
    pub fn offset(&self) -> usize {
        self.dims.offset()
    }
    /// The number of elements (the product of the shape).
    pub fn numel(&self) -> usize {
        self.dims.numel()
    }
    pub(crate) fn dims(&self) -> &Dims {
        &self.dims
    }
    pub(crate) fn src_mut(&mut self) -> &mut WriteSrc<'a> {
        &mut self.src
    }
    /// Rows `[start, start + len)` of the first dimension, writable for the duration of the
    /// borrow.
    pub(crate) fn narrow_rows(&mut self, what: &'static str, start: usize, len: usize) -> Result<TensorViewMut<'_>> {
        let dims = self.dims.narrow(what, 0, start, len)?;
        self.reborrow_within(what, dims)
    }
    /// A writable view of part of this one's memory, for the duration of the borrow: `dims` is a
    /// layout over the same buffer and must lie within the elements this view spans.
    pub(crate) fn reborrow_within(&mut self, what: &'static str, dims: Dims) -> Result<TensorViewMut<'_>> {
        let within = match (self.dims.span(what)?, dims.span(what)?) {
            (_, None) => true,
            (Some((first, last)), Some((f, l))) => f >= first && l <= last,
            (None, Some(_)) => false,
        };
        if !within {
            return Err(Error::InvalidView { what, why: "the part lies outside the view".into() });
        }
        let src = match &mut self.src {
            WriteSrc::Storage(s) => WriteSrc::Storage(s),
            WriteSrc::Cuda(c) => WriteSrc::Cuda(&mut **c),
            WriteSrc::Host(a) => WriteSrc::Host(*a),
        };
        Ok(TensorViewMut { src, dtype: self.dtype, dims, _borrow: PhantomData })
    }
}
