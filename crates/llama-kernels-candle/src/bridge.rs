//! candle's storage as llama-kernels views: the one place that knows both sides.
//!
//! A candle op receives its inputs as backend storages (`CpuStorage`, `CudaStorage`) with a
//! [`Layout`]. [`KernelStorage`] lends them to the kernels without a copy: a CPU storage's
//! slice becomes a host view on the emulated target (CUDA threads as fibers on the CPU, the
//! same `.cu` sources), a CUDA storage's `CudaSlice` becomes a device view queued on candle's
//! own stream. Outputs are fresh storages of the same backend, allocated through candle.
//!
//! Every op here is a [`Kernel`]: inputs in, any number of outputs out, written once against
//! the [`KernelStorage`] trait. A forward op is a candle `CustomOp` whose `cpu_fwd` and
//! `cuda_fwd` both call [`Kernel::run`] ([`custom_op!`]); a backward, which may return several
//! gradients, runs through [`launch`] on candle tensors.

use std::sync::{Mutex, OnceLock};

use candle::backend::{BackendDevice, BackendStorage};
use candle::op::BackpropOp;
use candle::{CpuStorage, DType, Layout, Shape, Storage, Tensor};
use llama_kernels::{Device, TensorView, TensorViewMut};

/// A llama-kernels error as a candle error: the message is the named error's (op, argument,
/// reason).
pub(crate) fn kernel_err(e: llama_kernels::Error) -> candle::Error {
    candle::Error::wrap(e)
}

/// A candle error of this crate's own checks, naming the op.
pub(crate) fn op_err(op: &'static str, why: impl std::fmt::Display) -> candle::Error {
    candle::Error::msg(format!("{op}: {why}"))
}

/// The kernels' dtype of a candle dtype, for the ops that allocate kernel-side scratch.
pub(crate) fn kernel_dtype(op: &'static str, dtype: DType) -> candle::Result<llama_kernels::DType> {
    use llama_kernels::DType as K;
    Ok(match dtype {
        DType::F32 => K::F32,
        DType::F16 => K::F16,
        DType::BF16 => K::BF16,
        DType::I32 => K::I32,
        DType::I64 => K::I64,
        DType::U8 => K::U8,
        other => return Err(op_err(op, format_args!("dtype {other:?} is not one the kernels take"))),
    })
}

/// The emulated device every CPU-backed call runs on (one per process: the emulator's
/// workers are shared).
fn emulated() -> &'static Device {
    static EMULATED: OnceLock<Device> = OnceLock::new();
    EMULATED.get_or_init(Device::emulated)
}

/// The llama-kernels device that runs on `device`'s tensors: the emulated target for candle's
/// CPU, candle's own stream for a CUDA device.
pub(crate) fn kernel_device_of(op: &'static str, device: &candle::Device) -> candle::Result<Device> {
    match device {
        candle::Device::Cpu => Ok(emulated().clone()),
        #[cfg(feature = "cuda")]
        candle::Device::Cuda(d) => cuda_kernel_device(d),
        other => Err(op_err(op, format_args!("runs on CPU and CUDA tensors, not {:?}", other.location()))),
    }
}

/// The llama-kernels device queued on a candle CUDA device's stream.
#[cfg(feature = "cuda")]
fn cuda_kernel_device(device: &candle::CudaDevice) -> candle::Result<Device> {
    use llama_kernels::Queue;
    device.cuda_stream().queue_device().map_err(kernel_err)
}

/// A value a forward keeps for its backward (the attention's LSE, the loss's gradients): an op
/// is shared by candle's graph, so it lives behind a lock.
#[derive(Debug)]
pub(crate) struct Kept<T>(Mutex<Option<T>>);

impl<T: Clone> Kept<T> {
    pub fn new() -> Self {
        Kept(Mutex::new(None))
    }
    /// Keeps `value`, replacing what an earlier forward kept.
    pub fn put(&self, op: &'static str, value: T) -> candle::Result<()> {
        *self.0.lock().map_err(|_| op_err(op, "a previous call panicked"))? = Some(value);
        Ok(())
    }
    /// What the forward kept, else an error naming `what`.
    pub fn get(&self, op: &'static str, what: &str) -> candle::Result<T> {
        let kept = self.0.lock().map_err(|_| op_err(op, "a previous call panicked"))?.clone();
        kept.ok_or_else(|| op_err(op, format_args!("no {what}: the forward has not run")))
    }
}

/// Device-resident state built once per kernel device (candle's CPU, each CUDA stream's
/// context) on first use: a RoPE table, a packed weight.
#[derive(Debug)]
pub(crate) struct PerDevice<T> {
    items: Mutex<Vec<(Device, T)>>,
}

impl<T: Clone> PerDevice<T> {
    pub fn new() -> Self {
        PerDevice { items: Mutex::new(Vec::new()) }
    }
    /// The item for `device`'s context, made by `make` the first time.
    pub fn get(
        &self,
        op: &'static str,
        device: &Device,
        make: impl FnOnce(&Device) -> llama_kernels::Result<T>,
    ) -> candle::Result<T> {
        let mut items = self.items.lock().map_err(|_| op_err(op, "a previous call panicked"))?;
        if let Some((_, item)) = items.iter().find(|(d, _)| d.same_context(device)) {
            return Ok(item.clone());
        }
        let item = make(device).map_err(kernel_err)?;
        items.push((device.clone(), item.clone()));
        Ok(item)
    }
}

/// A candle backend storage the kernels can read and write in place.
pub(crate) trait KernelStorage: BackendStorage<Device: BackendDevice<Storage = Self>> + Sized {
    /// The llama-kernels device whose queue runs on this storage's memory: the emulated target
    /// for the CPU, candle's own stream for CUDA.
    fn kernel_device(&self) -> candle::Result<Device>;
    /// A read-only view with an explicit layout (elements).
    fn view_with<'a>(&'a self, shape: &[usize], strides: &[usize], offset: usize) -> candle::Result<TensorView<'a>>;
    /// A writable contiguous view from the first element.
    fn view_mut<'a>(&'a mut self, shape: &[usize]) -> candle::Result<TensorViewMut<'a>>;
    /// Two writable contiguous views, of `first` then `second` elements from the start, lent
    /// to `f` together (one buffer, two outputs).
    fn with_pair<R>(
        &mut self,
        first: &[usize],
        second: &[usize],
        f: impl FnOnce(&mut TensorViewMut<'_>, &mut TensorViewMut<'_>) -> candle::Result<R>,
    ) -> candle::Result<R>;
    /// This storage as candle's enum.
    fn into_storage(self) -> Storage;
    /// The storage of this backend inside candle's enum, if it is one.
    fn of(storage: &Storage) -> Option<&Self>;
}

/// The typed slice of a storage enum, for each dtype the kernels take.
macro_rules! by_dtype {
    ($enum:ident, $s:expr, $dtype:expr, |$v:ident| $body:expr, $op:expr) => {
        match $s {
            $enum::F32($v) => $body,
            $enum::F16($v) => $body,
            $enum::BF16($v) => $body,
            $enum::I32($v) => $body,
            $enum::I64($v) => $body,
            $enum::U8($v) => $body,
            _ => Err(op_err($op, format_args!("dtype {:?} is not one the kernels take", $dtype))),
        }
    };
}

impl KernelStorage for CpuStorage {
    fn kernel_device(&self) -> candle::Result<Device> {
        Ok(emulated().clone())
    }
    fn view_with<'a>(&'a self, shape: &[usize], strides: &[usize], offset: usize) -> candle::Result<TensorView<'a>> {
        let dtype = self.dtype();
        by_dtype!(
            CpuStorage,
            self,
            dtype,
            |s| TensorView::host_strided(s, shape, strides, offset).map_err(kernel_err),
            "view"
        )
    }
    fn view_mut<'a>(&'a mut self, shape: &[usize]) -> candle::Result<TensorViewMut<'a>> {
        let dtype = self.dtype();
        by_dtype!(CpuStorage, self, dtype, |s| TensorViewMut::host(s, shape).map_err(kernel_err), "view")
    }
    fn with_pair<R>(
        &mut self,
        first: &[usize],
        second: &[usize],
        f: impl FnOnce(&mut TensorViewMut<'_>, &mut TensorViewMut<'_>) -> candle::Result<R>,
    ) -> candle::Result<R> {
        let (dtype, n) = (self.dtype(), first.iter().product::<usize>());
        by_dtype!(
            CpuStorage,
            self,
            dtype,
            |s| {
                let mid = n.min(s.len());
                let (a, b) = s.split_at_mut(mid);
                let mut a = TensorViewMut::host(a, first).map_err(kernel_err)?;
                let mut b = TensorViewMut::host(b, second).map_err(kernel_err)?;
                f(&mut a, &mut b)
            },
            "view"
        )
    }
    fn into_storage(self) -> Storage {
        Storage::Cpu(self)
    }
    fn of(storage: &Storage) -> Option<&Self> {
        match storage {
            Storage::Cpu(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
impl KernelStorage for candle::CudaStorage {
    fn kernel_device(&self) -> candle::Result<Device> {
        cuda_kernel_device(&self.device)
    }
    fn view_with<'a>(&'a self, shape: &[usize], strides: &[usize], offset: usize) -> candle::Result<TensorView<'a>> {
        use candle::cuda_backend::CudaStorageSlice as S;
        let dtype = self.dtype();
        by_dtype!(
            S,
            &self.slice,
            dtype,
            |s| TensorView::cuda_strided(s, shape, strides, offset).map_err(kernel_err),
            "view"
        )
    }
    fn view_mut<'a>(&'a mut self, shape: &[usize]) -> candle::Result<TensorViewMut<'a>> {
        use candle::cuda_backend::CudaStorageSlice as S;
        let dtype = self.dtype();
        by_dtype!(S, &mut self.slice, dtype, |s| TensorViewMut::cuda(s, shape).map_err(kernel_err), "view")
    }
    fn with_pair<R>(
        &mut self,
        first: &[usize],
        second: &[usize],
        f: impl FnOnce(&mut TensorViewMut<'_>, &mut TensorViewMut<'_>) -> candle::Result<R>,
    ) -> candle::Result<R> {
        use candle::cuda_backend::CudaStorageSlice as S;
        let (dtype, n) = (self.dtype(), first.iter().product::<usize>());
        by_dtype!(
            S,
            &mut self.slice,
            dtype,
            |s| {
                let mid = n.min(s.len());
                let (mut a, mut b) = s.split_at_mut(mid);
                let mut a = TensorViewMut::cuda(&mut a, first).map_err(kernel_err)?;
                let mut b = TensorViewMut::cuda(&mut b, second).map_err(kernel_err)?;
                f(&mut a, &mut b)
            },
            "view"
        )
    }
    fn into_storage(self) -> Storage {
        Storage::Cuda(self)
    }
    fn of(storage: &Storage) -> Option<&Self> {
        match storage {
            Storage::Cuda(s) => Some(s),
            _ => None,
        }
    }
}

/// One input of a kernel: a storage and the layout candle reads it with.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a, S> {
    pub storage: &'a S,
    pub layout: &'a Layout,
}

impl<'a, S: KernelStorage> Input<'a, S> {
    /// The dimensions.
    pub fn dims(&self) -> &'a [usize] {
        self.layout.dims()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    /// The view candle's layout describes (any strides; the kernel says which it takes).
    pub fn view(&self) -> candle::Result<TensorView<'a>> {
        self.storage.view_with(self.layout.dims(), self.layout.stride(), self.layout.start_offset())
    }
    /// The same elements read as `shape` (same count), which needs a contiguous layout.
    pub fn view_as(&self, op: &'static str, what: &str, shape: &[usize]) -> candle::Result<TensorView<'a>> {
        if !self.layout.is_contiguous() {
            return Err(op_err(op, format_args!("{what} must be contiguous (call .contiguous() first)")));
        }
        if shape.iter().product::<usize>() != self.layout.shape().elem_count() {
            return Err(op_err(op, format_args!("{what} {:?} cannot be read as {shape:?}", self.dims())));
        }
        let strides = contiguous_strides(shape);
        self.storage.view_with(shape, &strides, self.layout.start_offset())
    }
    /// A zeroed storage of this input's backend and device.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> candle::Result<S> {
        self.storage.device().zeros_impl(&Shape::from_dims(shape), dtype)
    }
    /// A contiguous copy of this input (the start of an op that works in place).
    pub fn copy(&self) -> candle::Result<S> {
        let mut out = self.zeros(self.dims(), self.dtype())?;
        self.storage.copy_strided_src(&mut out, 0, self.layout)?;
        Ok(out)
    }
}

/// Row-major strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// An op on the kernels: inputs in, outputs (storage and shape) out, for every backend.
pub(crate) trait Kernel {
    /// The op's name in candle's graph and in errors.
    const NAME: &'static str;
    /// Runs the kernels on `inputs` (as many as the op takes, in its order).
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> candle::Result<Vec<(S, Shape)>>;
}

/// `inputs` as exactly `N` inputs, else an error naming the op.
pub(crate) fn arity<'i, 'a, S, const N: usize>(
    op: &'static str,
    inputs: &'i [Input<'a, S>],
) -> candle::Result<&'i [Input<'a, S>; N]> {
    inputs.try_into().map_err(|_| op_err(op, format_args!("takes {N} inputs, got {}", inputs.len())))
}

/// The first output of a forward run (a `CustomOp` returns one tensor).
pub(crate) fn first<S>(outputs: Vec<(S, Shape)>, op: &'static str) -> candle::Result<(S, Shape)> {
    outputs.into_iter().next().ok_or_else(|| op_err(op, "produced no output"))
}

/// A kernel output as a candle tensor outside the autograd graph.
pub(crate) fn tensor_of<S: KernelStorage>(storage: S, shape: Shape) -> Tensor {
    Tensor::from_storage(storage.into_storage(), shape, BackpropOp::none(), false)
}

/// Runs `kernel` on candle tensors (all on one device) and returns its outputs as tensors that
/// are not part of the autograd graph: how the backward passes, which return several gradients,
/// call the kernels.
pub(crate) fn launch<K: Kernel>(kernel: &K, inputs: &[&Tensor]) -> candle::Result<Vec<Tensor>> {
    let guards: Vec<_> = inputs.iter().map(|t| t.storage_and_layout()).collect();
    match guards.first().map(|(s, _)| &**s) {
        Some(first @ Storage::Cpu(_)) => launch_as::<CpuStorage, K>(kernel, first.device().location(), &guards),
        #[cfg(feature = "cuda")]
        Some(first @ Storage::Cuda(_)) => {
            launch_as::<candle::CudaStorage, K>(kernel, first.device().location(), &guards)
        }
        Some(other) => Err(op_err(K::NAME, format_args!("runs on CPU and CUDA tensors, not {:?}", other.device()))),
        None => Err(op_err(K::NAME, "no inputs")),
    }
}

fn launch_as<S: KernelStorage, K: Kernel>(
    kernel: &K,
    first: candle::DeviceLocation,
    guards: &[(candle::StorageRef<'_>, &Layout)],
) -> candle::Result<Vec<Tensor>> {
    let inputs = guards
        .iter()
        .map(|(s, layout)| {
            S::of(s).map(|storage| Input { storage, layout }).ok_or_else(|| {
                candle::Error::DeviceMismatchBinaryOp { lhs: first, rhs: s.device().location(), op: K::NAME }.bt()
            })
        })
        .collect::<candle::Result<Vec<_>>>()?;
    Ok(kernel.run(&inputs)?.into_iter().map(|(s, shape)| tensor_of(s, shape)).collect())
}

/// One `*_fwd` method of a candle `CustomOp` over `$storage`: [`Forward::forward`] (or the op's
/// own `forward`) on its inputs.
macro_rules! fwd {
    ($name:ident, $storage:ty; $($s:ident $l:ident),+) => {
        fn $name(&self, $($s: &$storage, $l: &candle::Layout),+) -> candle::Result<($storage, candle::Shape)> {
            self.forward(&[$($crate::bridge::Input { storage: $s, layout: $l }),+])
        }
    };
}
pub(crate) use fwd;

/// Implements candle's `CustomOp1/2/3` for a [`Kernel`] whose first output is the op's result:
/// `cpu_fwd` and `cuda_fwd` both run the op's `forward`; `bwd` calls the type's `backward`
/// with the arguments as an array and returns its gradients.
macro_rules! custom_op {
    (CustomOp1 for $ty:ty) => {
        impl candle::CustomOp1 for $ty {
            fn name(&self) -> &'static str {
                <$ty as $crate::bridge::Kernel>::NAME
            }
            $crate::bridge::fwd!(cpu_fwd, candle::CpuStorage; s l);
            #[cfg(feature = "cuda")]
            $crate::bridge::fwd!(cuda_fwd, candle::CudaStorage; s l);
            fn bwd(&self, a: &candle::Tensor, res: &candle::Tensor, grad: &candle::Tensor) -> candle::Result<Option<candle::Tensor>> {
                let [da] = self.backward([a], res, grad)?;
                Ok(da)
            }
        }
    };
    (CustomOp2 for $ty:ty) => {
        impl candle::CustomOp2 for $ty {
            fn name(&self) -> &'static str {
                <$ty as $crate::bridge::Kernel>::NAME
            }
            $crate::bridge::fwd!(cpu_fwd, candle::CpuStorage; s1 l1, s2 l2);
            #[cfg(feature = "cuda")]
            $crate::bridge::fwd!(cuda_fwd, candle::CudaStorage; s1 l1, s2 l2);
            fn bwd(
                &self,
                a: &candle::Tensor,
                b: &candle::Tensor,
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<(Option<candle::Tensor>, Option<candle::Tensor>)> {
                let [da, db] = self.backward([a, b], res, grad)?;
                Ok((da, db))
            }
        }
    };
    (CustomOp3 for $ty:ty) => {
        impl candle::CustomOp3 for $ty {
            fn name(&self) -> &'static str {
                <$ty as $crate::bridge::Kernel>::NAME
            }
            $crate::bridge::fwd!(cpu_fwd, candle::CpuStorage; s1 l1, s2 l2, s3 l3);
            #[cfg(feature = "cuda")]
            $crate::bridge::fwd!(cuda_fwd, candle::CudaStorage; s1 l1, s2 l2, s3 l3);
            fn bwd(
                &self,
                a: &candle::Tensor,
                b: &candle::Tensor,
                c: &candle::Tensor,
                res: &candle::Tensor,
                grad: &candle::Tensor,
            ) -> candle::Result<(Option<candle::Tensor>, Option<candle::Tensor>, Option<candle::Tensor>)> {
                let [da, db, dc] = self.backward([a, b, c], res, grad)?;
                Ok((da, db, dc))
            }
        }
    };
}
pub(crate) use custom_op;

/// The forward of a single-result op: [`Kernel::run`]'s first output. Ops with extra outputs
/// (the attention's LSE) implement `forward` themselves.
pub(crate) trait Forward: Kernel {
    fn forward<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> candle::Result<(S, Shape)> {
        first(self.run(inputs)?, Self::NAME)
    }
}
