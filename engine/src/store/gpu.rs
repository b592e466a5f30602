//! The GPU compression stage: one thread per store gathers the new chunks of every file being
//! written into batches for the GPU codec. The daemon is the GPU's one user on a node, and
//! when many checkpoints are written at once their chunks share batches: a batch holds
//! whatever the workers queued while the previous one was on the GPU, up to
//! `GPU_BATCH_BYTES`.
//!
//! Workers hash and look up each piece first (a dedup hit never reaches the GPU), then queue
//! the misses here with their pipeline permit. After a batch is compressed, its chunks are
//! appended by a worker job (the appends and data-file writes stay off this thread, so it can
//! feed the GPU the next batch) and their tickets completed. Memory: the queue and the batch
//! on the GPU are covered by the permits, so by the store's `PIPELINE_BYTES`.
//!
//! If the GPU fails at run time, that batch and every later one are compressed on the CPU
//! (logged): a chunk is never lost to a GPU error, and a broken GPU is not retried per batch.

use super::ChunkStore;
use crate::format::{ChunkHash, Codec};
use crate::write::pipeline::{Completion, Permit, Piece};
use crate::Error;
use ckptfs_kernels::BatchCodec;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

/// Raw bytes handed to the GPU in one call at most. Half the pipeline budget, so one batch
/// can be on the GPU while the next one gathers.
pub(crate) const GPU_BATCH_BYTES: usize = 32 << 20;

/// Sub-batch size the daemon asks of the GPU codec: a batch goes in four, so the copies of
/// one sub-batch overlap the kernel of another within a call (a whole batch in one sub-batch
/// would copy in, compute and copy out one after the other). Not yet measured on a GPU;
/// `ckptfs-bench gpu --sub-batch` is how to.
pub const GPU_SUB_BATCH_BYTES: usize = GPU_BATCH_BYTES / 4;

/// A piece the dedup lookup did not find.
pub(crate) struct NewChunk {
    pub hash: ChunkHash,
    pub piece: Piece,
    pub done: Completion,
}

/// A worker's misses of one submitted batch and the permit that covers them.
struct Job {
    chunks: Vec<NewChunk>,
    bytes: usize,
    permit: Permit,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: bool,
}

pub(crate) struct GpuStage {
    queue: Arc<(Mutex<Queue>, Condvar)>,
}

impl GpuStage {
    pub fn start(codec: Arc<dyn BatchCodec>, store: Weak<ChunkStore>) -> Arc<GpuStage> {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = queue.clone();
        std::thread::Builder::new()
            .name("ckptfs-gpu".into())
            .spawn(move || run(codec, store, q))
            .expect("spawn the GPU batch thread");
        Arc::new(GpuStage { queue })
    }

    /// Queues misses for the next batch; an empty list just releases the permit.
    pub fn push(&self, chunks: Vec<NewChunk>, permit: Permit) {
        if chunks.is_empty() {
            return;
        }
        let bytes = chunks.iter().map(|c| c.piece.len()).sum();
        let (m, cv) = &*self.queue;
        m.lock().jobs.push_back(Job {
            chunks,
            bytes,
            permit,
        });
        cv.notify_one();
    }
}

impl Drop for GpuStage {
    /// The thread finishes the jobs already queued, then ends. It is not joined: the store
    /// may be dropped on that very thread.
    fn drop(&mut self) {
        let (m, cv) = &*self.queue;
        m.lock().stop = true;
        cv.notify_one();
    }
}

fn run(codec: Arc<dyn BatchCodec>, store: Weak<ChunkStore>, queue: Arc<(Mutex<Queue>, Condvar)>) {
    // Set after the first GPU failure; only this thread reads it.
    let mut disabled = false;
    loop {
        let batch = {
            let (m, cv) = &*queue;
            let mut q = m.lock();
            while q.jobs.is_empty() && !q.stop {
                cv.wait(&mut q);
            }
            if q.jobs.is_empty() {
                return;
            }
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(job) = q.jobs.front() {
                if !batch.is_empty() && bytes + job.bytes > GPU_BATCH_BYTES {
                    break;
                }
                bytes += job.bytes;
                batch.push(q.jobs.pop_front().expect("front exists"));
            }
            batch
        };
        let Some(store) = store.upgrade() else {
            for job in batch {
                for c in job.chunks {
                    c.done.complete(Err(Error::Failed));
                }
            }
            continue;
        };
        let compressed = compress(&*codec, &store, &batch, &mut disabled);
        // One worker job per queued job: appends of a large batch spread over the workers.
        let compressed = Arc::new(compressed);
        let mut first = 0;
        let pool = store.pipeline().pool();
        for job in batch {
            let (store, compressed) = (store.clone(), compressed.clone());
            let start = first;
            first += job.chunks.len();
            pool.run(move || {
                for (i, c) in job.chunks.into_iter().enumerate() {
                    let raw = c.piece.bytes();
                    let r = match &*compressed {
                        Encoded::Gpu(out) => match out.get(start + i) {
                            Some(block) => store.store_new(c.hash, raw.len(), Codec::Lz4, block),
                            None => store.store_new(c.hash, raw.len(), Codec::Raw, raw),
                        },
                        Encoded::Cpu(v) => {
                            let (codec, enc) = &v[start + i];
                            store.store_new(
                                c.hash,
                                raw.len(),
                                *codec,
                                enc.as_deref().unwrap_or(raw),
                            )
                        }
                    };
                    c.done.complete(r);
                }
                drop(job.permit);
            });
        }
    }
}

/// A batch's encodings: from the GPU, or from the CPU after a GPU failure.
enum Encoded {
    Gpu(ckptfs_kernels::Compressed),
    Cpu(Vec<(Codec, Option<Vec<u8>>)>),
}

fn compress(
    codec: &dyn BatchCodec,
    store: &ChunkStore,
    batch: &[Job],
    disabled: &mut bool,
) -> Encoded {
    let chunks: Vec<&[u8]> = batch
        .iter()
        .flat_map(|j| j.chunks.iter().map(|c| c.piece.bytes()))
        .collect();
    if !*disabled {
        let bytes = chunks.iter().map(|c| c.len()).sum();
        // A panic in the codec (a driver binding, the emulation) must not end this thread:
        // the tickets of every queued chunk would never complete and their writers would
        // hang. It counts as a GPU failure.
        let r = store.stages().gpu.time(bytes, || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| codec.compress(&chunks)))
                .unwrap_or_else(|_| {
                    Err(ckptfs_kernels::Error::Cuda("the GPU codec panicked".into()))
                })
        });
        match r {
            Ok(out) => return Encoded::Gpu(out),
            Err(e) => {
                *disabled = true;
                log::error!("GPU compression failed ({e}); compressing on the CPU from now on");
            }
        }
    }
    // What the CPU path writes: the store's policy (`Lz4Plain` on a space not marked for
    // the shuffle codecs).
    let policy = *store.w.codec.lock();
    let mut streak = crate::codec::Streak::default();
    Encoded::Cpu(
        chunks
            .iter()
            .map(|c| {
                store.stages().compress.time(c.len(), || {
                    crate::codec::encode_after(c, policy, &mut streak)
                })
            })
            .collect(),
    )
}
