//! The counting hook: launches, allocations, copies and host waits per context.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a device has done since it was created: the counting hook that proves a planned call
/// allocates nothing, copies nothing from pageable host memory and never waits on the host.
///
/// Counted per context (every [`Device`](crate::Device) on one CUDA context, or one emulated device and its
/// clones, share the counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Kernels queued.
    pub launches: u64,
    /// Device allocations (tensors, workspaces, staging buffers).
    pub allocations: u64,
    /// Host-to-device copies from pageable host memory (each can stall, and none is legal
    /// during CUDA graph capture).
    pub pageable_uploads: u64,
    /// Host-to-device copies from pinned staging memory (asynchronous, capturable).
    pub pinned_uploads: u64,
    /// Device-to-host copies.
    pub downloads: u64,
    /// Host waits for the device (stream or event synchronization).
    pub synchronizations: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    launches: AtomicU64,
    allocations: AtomicU64,
    pageable_uploads: AtomicU64,
    pinned_uploads: AtomicU64,
    downloads: AtomicU64,
    synchronizations: AtomicU64,
}

/// What a counter counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Count {
    Launch,
    Allocation,
    PageableUpload,
    PinnedUpload,
    Download,
    Synchronization,
}

impl Counters {
    pub(crate) fn add(&self, what: Count) {
        let c = match what {
            Count::Launch => &self.launches,
            Count::Allocation => &self.allocations,
            Count::PageableUpload => &self.pageable_uploads,
            Count::PinnedUpload => &self.pinned_uploads,
            Count::Download => &self.downloads,
            Count::Synchronization => &self.synchronizations,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> DeviceCounters {
        DeviceCounters {
            launches: self.launches.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            pageable_uploads: self.pageable_uploads.load(Ordering::Relaxed),
            pinned_uploads: self.pinned_uploads.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
            synchronizations: self.synchronizations.load(Ordering::Relaxed),
        }
    }
}
