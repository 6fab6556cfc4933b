//! Pinned staging for small per-call uploads (sequence offsets passed as host slices).
//!
//! A copy from pageable host memory makes the driver stage the bytes itself and is not allowed
//! while a stream is being captured into a CUDA graph. A workspace instead copies its host data
//! into page-locked memory it owns and queues an asynchronous copy from there. The staging
//! memory is a ring of slots, each with an event recorded after its copy: a slot is rewritten
//! only once its previous copy has run, so the host waits (and the counting hook records a
//! synchronization) only when the device is more than `SLOTS` calls behind.
//!
//! Host data cannot be captured into a CUDA graph: a captured copy would re-read the slot at
//! every replay, whatever it holds by then, and the ring's event queries are not allowed during
//! capture. [`PinnedStaging::upload`] therefore returns [`Error::Unsupported`] while the copying
//! stream or the stream of the kernels that read the upload is capturing; calls that take
//! device-resident offsets instead are the ones to capture.
//!
//! On the emulated target there is no staging: the "device" is host memory, and the copy is a
//! `memcpy` under the device's stream lock (counted as a pinned upload, which it stands for).

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::counters::Count;
use super::device::{Device, DeviceInner};
use super::storage::Storage;
use crate::error::{Error, Result};

/// Ring slots: a call may run while the copies of the `SLOTS - 1` calls before it are queued.
const SLOTS: usize = 4;

struct Slot {
    host: PinnedHostSlice<u8>,
    done: CudaEvent,
    used: bool,
}

/// Page-locked staging memory of one workspace (CUDA only).
pub struct PinnedStaging {
    slots: Vec<Slot>,
    next: usize,
    bytes: usize,
}

impl std::fmt::Debug for PinnedStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedStaging({} slots of {} bytes)", self.slots.len(), self.bytes)
    }
}

impl PinnedStaging {
    /// Staging for uploads of up to `bytes` bytes, or `None` on the emulated target.
    pub fn new(device: &Device, bytes: usize) -> Result<Option<PinnedStaging>> {
        let DeviceInner::Cuda(c) = &*device.0 else { return Ok(None) };
        let ctx = &c.shared.ctx;
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            device.count(Count::Allocation);
            // SAFETY: the memory is uninitialized until written; `upload` writes every byte it
            // copies before queueing the copy, and nothing reads it otherwise.
            let host = unsafe { ctx.alloc_pinned::<u8>(bytes.max(1)) }?;
            let done = ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
            slots.push(Slot { host, done, used: false });
        }
        Ok(Some(PinnedStaging { slots, next: 0, bytes }))
    }

    /// Copies `data` into `dst` at byte `dst_offset`, without waiting for the copy (`staging` is
    /// `None` on the emulated target).
    ///
    /// The copy is queued on the stream of `dst`'s device, and the slot's "copy done" event is
    /// recorded on that same stream, whatever stream the caller launches on afterwards: a slot
    /// is never rewritten while the copy that reads it is pending. (Readers on other streams are
    /// ordered after the copy by cudarc's write event on `dst`.) `reader` is the device (stream)
    /// whose kernels read the upload: `Err` ([`Error::Unsupported`]) when it or `dst`'s stream is
    /// being captured into a CUDA graph, before anything is written or queued.
    pub(crate) fn upload(
        staging: Option<&mut PinnedStaging>,
        data: &[u8],
        dst: &Storage,
        dst_offset: usize,
        reader: &Device,
    ) -> Result<()> {
        let device = dst.device();
        if reader.is_capturing()? || device.is_capturing()? {
            return Err(Error::Unsupported {
                what: "host data (such as host sequence offsets) during CUDA graph capture: a captured copy \
                       would replay stale data; pass device-resident offsets instead"
                    .into(),
            });
        }
        match (&*device.0, staging) {
            (DeviceInner::Emulated(_), _) => {
                // SAFETY: `data` is a live host slice of `data.len()` bytes; on the emulated
                // target the copy happens before this call returns.
                unsafe { dst.upload_pinned(dst_offset, data.as_ptr(), data.len()) }
            }
            (DeviceInner::Cuda(c), Some(s)) => {
                if data.len() > s.bytes {
                    return Err(Error::invalid("staging", "upload", data.len(), format!("exceeds {} bytes", s.bytes)));
                }
                let index = s.next;
                s.next = (s.next + 1) % s.slots.len();
                let slot = &mut s.slots[index];
                if slot.used && !slot.done.is_complete() {
                    device.count(Count::Synchronization);
                    slot.done.synchronize()?;
                }
                let ptr = slot.host.as_mut_ptr()?;
                // SAFETY: the slot holds `s.bytes >= data.len()` bytes of pinned memory that no
                // queued copy reads any more (its event completed above).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
                // SAFETY: the source is this slot's pinned memory, which is not written again
                // until `done` (recorded right after the copy) has completed.
                unsafe { dst.upload_pinned(dst_offset, ptr, data.len()) }?;
                slot.done.record(&c.stream)?;
                slot.used = true;
                Ok(())
            }
            (DeviceInner::Cuda(_), None) => {
                Err(Error::InvalidView { what: "staging", why: "workspace has no pinned staging buffer".into() })
            }
        }
    }
}

impl Drop for PinnedStaging {
    /// Waits for every slot's last copy before its pinned memory is freed: a queued copy must
    /// never read freed host memory.
    fn drop(&mut self) {
        for slot in &self.slots {
            if slot.used {
                // Errors cannot be reported from drop; a failed wait means the context is gone,
                // and with it every queued copy.
                let _ = slot.done.synchronize();
            }
        }
    }
}
