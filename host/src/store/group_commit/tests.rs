use super::*;
use redb::{Database, TableDefinition};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const T: TableDefinition<&[u8], &[u8]> = TableDefinition::new("t");

fn open(settings: Settings) -> (tempfile::TempDir, Arc<Database>, Arc<GroupCommit>) {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::create(dir.path().join("db")).unwrap());
    let wal = Wal::create(&dir.path().join("db-wal"), 1, 0).unwrap();
    let gc = GroupCommit::new(Backend::Redb(db.clone()), settings, Some(wal));
    (dir, db, gc)
}

fn put(l: &mut Lease, k: u64) {
    let BatchTxn::Redb(batch) = l.txn_mut() else {
        unreachable!("redb here")
    };
    let k = k.to_be_bytes().to_vec();
    batch
        .writes
        .entry("t".into())
        .or_default()
        .insert(k.clone(), Some(k));
}

/// Rows of `t` a reader sees (durable, in the database or the log).
fn count(gc: &GroupCommit, db: &Database) -> u64 {
    let view = gc.view(db).unwrap();
    let mut rows = crate::store::Rows::new();
    view.scan_layered(
        None,
        "t",
        &[],
        None,
        false,
        usize::MAX,
        usize::MAX,
        &mut rows,
    )
    .unwrap();
    rows.len() as u64
}

/// A database file that refuses writes once `full` is set, as a full
/// disk does.
#[derive(Debug)]
struct Filling {
    inner: redb::backends::InMemoryBackend,
    full: Arc<std::sync::atomic::AtomicBool>,
}

impl Filling {
    fn check(&self) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            Err(std::io::Error::other("no space left on device (test)"))
        } else {
            Ok(())
        }
    }
}

impl redb::StorageBackend for Filling {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
}

/// A store whose database file refuses every write once `full` is set
/// (its log is on a real disk).
fn filling() -> (
    tempfile::TempDir,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<GroupCommit>,
) {
    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let backend = Filling {
        inner: redb::backends::InMemoryBackend::new(),
        full: full.clone(),
    };
    let db = Arc::new(redb::Builder::new().create_with_backend(backend).unwrap());
    let wal = Wal::create(&dir.path().join("db-wal"), 1, 0).unwrap();
    let gc = GroupCommit::new(Backend::Redb(db), Settings::default(), Some(wal));
    // Checkpoints only when a test flushes: one due meanwhile (on a
    // loaded machine) would run before the test makes the file full.
    gc.lock().no_timed_checkpoints = true;
    (dir, full, gc)
}

#[test]
fn a_database_that_cannot_take_batches_any_more_is_broken() {
    // Once the file refuses a write redb refuses every later one, so
    // the batches stay in the log and writes fail until a restart:
    // `broken` says so (health answers 503 degraded with it).
    let (_dir, full, gc) = filling();
    let mut l = gc.acquire(gc.enter()).unwrap();
    put(&mut l, 1);
    gc.release(l, true).unwrap();
    gc.flush();
    assert!(!gc.broken());
    full.store(true, std::sync::atomic::Ordering::SeqCst);
    for k in 2..5 {
        let Ok(mut l) = gc.acquire(gc.enter()) else {
            break;
        };
        put(&mut l, k);
        let _ = gc.release(l, true);
        gc.flush();
        gc.wait_applied();
    }
    assert!(gc.broken(), "the database refused the batches");
    assert!(gc.failing());
}

#[test]
fn a_database_that_refuses_a_checkpoint_is_broken_at_once() {
    // redb refuses every write after its file refused one: a failed
    // checkpoint is that moment, not a later batch's.
    let (_dir, full, gc) = filling();
    let mut l = gc.acquire(gc.enter()).unwrap();
    put(&mut l, 1);
    gc.release(l, true).unwrap();
    gc.wait_applied();
    full.store(true, std::sync::atomic::Ordering::SeqCst);
    gc.flush();
    assert!(gc.broken(), "the checkpoint was refused");
}

#[test]
fn a_log_that_refuses_a_batch_fails_health_until_one_is_logged() {
    // A full disk refuses the log's append: that batch fails, and until
    // a later one is logged the store says it cannot keep writes.
    let (_d, _db, gc) = open(Settings::default());
    assert!(!gc.failing());
    gc.shared.fail_next.store(true, Ordering::Release);
    let mut l = gc.acquire(gc.enter()).unwrap();
    put(&mut l, 1);
    assert!(gc.release(l, true).is_err());
    assert!(gc.failing(), "the log refused the batch");
    let mut l = gc.acquire(gc.enter()).unwrap();
    put(&mut l, 2);
    gc.release(l, true).unwrap();
    assert!(!gc.failing(), "logged again");
}

#[test]
fn a_lone_writer_commits_at_once() {
    let (_d, db, gc) = open(Settings::default());
    for k in 0..3 {
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, k);
        gc.release(l, true).unwrap();
        assert_eq!(count(&gc, &db), k + 1, "visible (and durable) on return");
    }
    assert_eq!(gc.counters(), (3, 3));
}

#[test]
fn concurrent_writers_share_commits() {
    let (_d, db, gc) = open(Settings::default());
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let gc = gc.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut l = gc.acquire(gc.enter()).unwrap();
                    put(&mut l, t * 1000 + i);
                    std::thread::sleep(Duration::from_micros(50));
                    gc.release(l, true).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (commits, syncs) = gc.counters();
    assert_eq!(commits, 800);
    assert!(syncs < commits / 2, "little batching: {syncs} syncs");
    assert_eq!(count(&gc, &db), 800);
    let s = gc.lock();
    assert_eq!((s.leased, s.pending, s.txn.is_none()), (false, 0, true));
}

#[test]
fn a_failed_batch_mate_hands_on_and_the_batch_still_commits() {
    let (_d, db, gc) = open(Settings {
        window: Duration::from_secs(30),
        ..Settings::default()
    });
    let mut a = gc.acquire(gc.enter()).unwrap();
    put(&mut a, 1);
    let gc2 = gc.clone();
    let b = std::thread::spawn(move || {
        let b = gc2.acquire(gc2.enter()).unwrap();
        // B fails: hands the lease on without applying anything.
        gc2.release(b, false).unwrap();
    });
    while gc.lock().pending < 2 {
        std::thread::yield_now();
    }
    let started = std::time::Instant::now();
    gc.release(a, true).unwrap();
    b.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited the window"
    );
    assert_eq!(gc.counters(), (1, 1));
    assert_eq!(count(&gc, &db), 1);
}

#[test]
fn requests_that_keep_failing_on_the_lease_do_not_hold_a_members_batch() {
    let (_d, db, gc) = open(Settings {
        window: Duration::from_millis(20),
        ..Settings::default()
    });
    // Another request is under way all along (so the batch is never
    // left with nobody under way), and a flood of requests takes the
    // lease and fails, one after another (so it is never idle).
    let under_way = gc.enter();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (gc, stop) = (gc.clone(), stop.clone());
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                let failing = gc.acquire(gc.enter()).unwrap();
                gc.release(failing, false).unwrap();
            }
            std::time::Instant::now() < until
        })
    };
    let mut a = gc.acquire(gc.enter()).unwrap();
    put(&mut a, 1);
    gc.release(a, true).unwrap();
    // Committed while the flood still runs: it did not give up first.
    stop.store(true, Ordering::Relaxed);
    assert!(
        flood.join().unwrap(),
        "the member waited for the flood to end"
    );
    drop(under_way);
    assert_eq!(count(&gc, &db), 1);
}

#[test]
fn a_stuck_successor_is_bounded_by_the_window() {
    let (_d, db, gc) = open(Settings {
        window: Duration::from_millis(20),
        ..Settings::default()
    });
    let mut a = gc.acquire(gc.enter()).unwrap();
    put(&mut a, 1);
    // Another request is under way but never takes the lease.
    let stuck = gc.enter();
    gc.release(a, true).unwrap();
    drop(stuck);
    assert_eq!(count(&gc, &db), 1);
    assert_eq!(gc.counters(), (1, 1));
}

#[test]
fn a_request_that_never_writes_lets_the_batch_commit() {
    let (_d, db, gc) = open(Settings {
        window: Duration::from_secs(30),
        ..Settings::default()
    });
    let mut a = gc.acquire(gc.enter()).unwrap();
    put(&mut a, 1);
    let reader = gc.enter(); // under way; ends without storage
    let gc2 = gc.clone();
    let member = std::thread::spawn(move || gc2.release(a, true));
    while gc.lock().members == 0 {
        std::thread::yield_now();
    }
    assert_eq!(
        count(&gc, &db),
        0,
        "the batch waits for the pending request"
    );
    let started = std::time::Instant::now();
    drop(reader);
    member.join().unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited the window"
    );
    assert_eq!(count(&gc, &db), 1);
}

/// Closed batches not yet in the log.
fn sealed(gc: &GroupCommit) -> usize {
    let s = gc.lock();
    s.sealed.len() - s.logged
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !f() {
        assert!(started.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_failed_batch_fails_every_batch_that_read_through_it() {
    let (_d, db, gc) = open(Settings::default());
    let disk = gc.stall_log();
    let spawn_put = |k: u64| {
        let gc = gc.clone();
        std::thread::spawn(move || {
            let mut l = gc.acquire(gc.enter()).unwrap();
            put(&mut l, k);
            gc.release(l, true)
        })
    };
    let a = spawn_put(1);
    wait_for("batch 1 closed", || sealed(&gc) == 1);
    // Opened over batch 1, which is not on disk yet.
    let b = spawn_put(2);
    wait_for("batch 2 closed", || sealed(&gc) == 2);
    gc.shared.fail_next.store(true, Ordering::Release);
    drop(disk);
    assert!(a.join().unwrap().is_err(), "its own commit failed");
    assert!(b.join().unwrap().is_err(), "it read a batch that failed");
    assert_eq!(count(&gc, &db), 0, "nothing of either is written");
    wait_for("both gone", || gc.lock().sealed.is_empty());
    // A batch opened after them starts from what is on disk.
    let mut l = gc.acquire(gc.enter()).unwrap();
    put(&mut l, 3);
    gc.release(l, true).unwrap();
    assert_eq!(count(&gc, &db), 1);
    assert_eq!(gc.counters(), (1, 1));
}

#[test]
fn a_stalled_disk_holds_writers_back_and_reorders_nothing() {
    // Every request adds one to a counter it reads: a batch committed
    // out of order, or a write lost, leaves the counter short.
    let (_d, db, gc) = open(Settings::default());
    let stop = Arc::new(AtomicBool::new(false));
    let staller = {
        let (gc, stop) = (gc.clone(), stop.clone());
        std::thread::spawn(move || {
            // The database (as while a checkpoint runs) and the log
            // stall in turn.
            while !stop.load(Ordering::Acquire) {
                gc.hold_apply(true);
                std::thread::sleep(Duration::from_millis(3));
                gc.hold_apply(false);
                let log = gc.stall_log();
                std::thread::sleep(Duration::from_millis(3));
                drop(log);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let most = Arc::new(Mutex::new(0usize));
    let threads: Vec<_> = (0..12)
        .map(|_| {
            let (gc, most) = (gc.clone(), most.clone());
            std::thread::spawn(move || {
                for _ in 0..40 {
                    let mut l = gc.acquire(gc.enter()).unwrap();
                    bump(&mut l);
                    let mut m = most.lock().unwrap();
                    *m = (*m).max(sealed(&gc));
                    drop(m);
                    gc.release(l, true).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    staller.join().unwrap();
    assert_eq!(counter(&gc, &db), 480);
    assert_eq!(gc.counters().0, 480);
    assert!(
        *most.lock().unwrap() <= MAX_SEALED,
        "closed batches bounded"
    );
    assert_eq!(sealed(&gc), 0);
}

/// Add one to the counter (`n` in table `t`) in the lease's batch.
fn bump(l: &mut Lease) {
    let key = b"n".to_vec();
    let BatchTxn::Redb(batch) = l.txn_mut() else {
        unreachable!("redb here")
    };
    let n = match batch.written("t", &key) {
        Some(v) => u64::from_be_bytes(v.clone().unwrap().try_into().unwrap()),
        None => batch
            .snapshot
            .open_table(T)
            .ok()
            .and_then(|t| t.get(key.as_slice()).unwrap())
            .map_or(0, |v| u64::from_be_bytes(v.value().try_into().unwrap())),
    };
    batch
        .writes
        .entry("t".into())
        .or_default()
        .insert(key, Some((n + 1).to_be_bytes().to_vec()));
}

fn counter(gc: &GroupCommit, db: &Database) -> u64 {
    let v = gc
        .view(db)
        .unwrap()
        .get_layered("t", b"n")
        .unwrap()
        .unwrap();
    u64::from_be_bytes(v.try_into().unwrap())
}

#[test]
fn tasks_and_threads_take_turns_and_lose_no_update() {
    let (_d, db, gc) = open(Settings::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let gc = gc.clone();
            rt.spawn(async move {
                for _ in 0..20 {
                    let mut l = gc.acquire_async(gc.enter()).await.unwrap();
                    bump(&mut l);
                    tokio::task::yield_now().await;
                    gc.release_async(l, true).await.unwrap();
                }
            })
        })
        .collect();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let gc = gc.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let mut l = gc.acquire(gc.enter()).unwrap();
                    bump(&mut l);
                    gc.release(l, true).unwrap();
                }
            })
        })
        .collect();
    rt.block_on(async {
        for t in tasks {
            t.await.unwrap();
        }
    });
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(counter(&gc, &db), 560);
    let (commits, syncs) = gc.counters();
    assert_eq!(commits, 560);
    assert!(syncs < commits, "no batching: {syncs} syncs");
    let s = gc.lock();
    assert_eq!((s.leased, s.pending, s.queue.len()), (false, 0, 0));
}

#[test]
fn a_task_cancelled_in_the_queue_holds_nobody_up() {
    use std::future::Future;
    let (_d, db, gc) = open(Settings {
        window: Duration::from_secs(30),
        ..Settings::default()
    });
    let mut cx = std::task::Context::from_waker(Waker::noop());
    for granted in [false, true] {
        let holder = gc.acquire(gc.enter()).unwrap();
        let mut queued = Box::pin(gc.acquire_async(gc.enter()));
        assert!(queued.as_mut().poll(&mut cx).is_pending());
        if granted {
            // The lease passes to the queued task, which never runs.
            gc.release(holder, false).unwrap();
            drop(queued);
        } else {
            drop(queued);
            gc.release(holder, false).unwrap();
        }
        {
            let s = gc.lock();
            assert_eq!((s.leased, s.pending, s.queue.len()), (false, 0, 0));
        }
        // The next writer gets the lease, and its batch commits at once
        // (nobody is counted as under way any more).
        let mut l = gc.acquire(gc.enter()).unwrap();
        bump(&mut l);
        gc.release(l, true).unwrap();
    }
    assert_eq!(counter(&gc, &db), 2);
}

#[test]
fn disabled_means_one_commit_each() {
    let (_d, _db, gc) = open(Settings {
        enabled: false,
        ..Settings::default()
    });
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let gc = gc.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let mut l = gc.acquire(gc.enter()).unwrap();
                    put(&mut l, t * 100 + i);
                    gc.release(l, true).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(gc.counters(), (80, 80));
}

/// The order in which `hand_on` grants a queue of waiters from `sources`
/// that came at once, the lease last having gone to `last`.
fn turns(sources: &[u64], last: u64) -> Vec<usize> {
    let mut s = Slot::default();
    GroupCommit::served(&mut s, last);
    let waiters: Vec<_> = sources
        .iter()
        .map(|&src| Waiter::new(None, src, s.turn))
        .collect();
    s.queue.extend(waiters.iter().cloned());
    s.leased = true;
    let mut order = Vec::new();
    for _ in sources {
        GroupCommit::hand_on(&mut s);
        let granted = (0..waiters.len())
            .find(|i| waiters[*i].granted() && !order.contains(i))
            .expect("one more granted");
        order.push(granted);
    }
    GroupCommit::hand_on(&mut s);
    assert!(!s.leased, "an empty queue frees the lease");
    order
}

#[test]
fn sources_take_turns_for_the_lease_each_in_its_own_order() {
    let (a, b, c) = (3, 5, 7);
    // One client's queued requests no longer all go before another's.
    assert_eq!(turns(&[a, a, a, b, a], a), [3, 0, 1, 2, 4]);
    // Those not served last go first, each keeping its own order.
    assert_eq!(turns(&[a, a, b, a, c], a), [2, 4, 0, 1, 3]);
    // Two clients with many requests each do not keep a third waiting
    // for both backlogs: one turn each a round.
    assert_eq!(turns(&[a, a, a, b, b, b, c], 9), [0, 3, 6, 1, 4, 2, 5]);
    // One source (the host's own writers, a lone client): first come,
    // first served.
    assert_eq!(turns(&[0, 0, 0, 0], 0), [0, 1, 2, 3]);
    assert_eq!(turns(&[a, a, a], b), [0, 1, 2]);
}

/// A waiter's place never grows while it waits, and a later comer's is at
/// least the grants then: however clients come and go, the first waiter
/// is served within as many grants as there were waiters when it came.
#[test]
fn no_waiter_starves_however_sources_come_and_go() {
    let mut s = Slot {
        leased: true,
        ..Default::default()
    };
    // Its client was just served: every newcomer is ahead of it at first.
    GroupCommit::served(&mut s, 1);
    let old = Waiter::new(None, 1, s.turn);
    s.queue.push_back(old.clone());
    // Each round a new client comes (never served: the best place a
    // newcomer can have) and another leaves.
    for round in 0..10u64 {
        let newcomer = Waiter::new(None, 100 + round, s.turn);
        s.queue.push_back(newcomer);
        GroupCommit::hand_on(&mut s);
        if old.granted() {
            assert!(round <= 1, "served at round {round}");
            return;
        }
    }
    panic!("the first waiter was never served");
}
