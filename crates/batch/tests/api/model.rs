//! A model of a batch's moves, checked exhaustively with stateright: the Lua moves of
//! `crates/batch/src/lua` (begin, advance, collect, cancel, seal, finish) and the stewards that
//! call them, with every interleaving of a steward that dies mid-ingestion (its last round trip
//! sent again by the next), processors answering each generation once (the durable queue's
//! contract), results collected in any order, a cancel and the window passing at any moment,
//! and two stewards writing one batch's files, one of them dying or reading after the other
//! finished (and the filed results were dropped).
//!
//! Checked: once sealed, a batch's filed results never change; the files recorded hold exactly
//! the frozen results (one line per line, from the first result of each); a completed batch has
//! every line's result; and every path ends with the batch ended (none stuck in in_progress,
//! finalizing or cancelling).

use stateright::{Checker, Model, Property};

const N: usize = 3;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Status {
    Validating,
    InProgress,
    Finalizing,
    Cancelling,
    Completed,
    Cancelled,
    Expired,
}

impl Status {
    fn ended(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Cancelled | Status::Expired
        )
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Writer {
    Idle,
    /// Read the batch: sealed, not ended.
    Started,
    /// Read the filed results (all gone when it read after the batch ended).
    Read([bool; N]),
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Batch {
    status: Status,
    sealed: Option<Status>,
    cursor: usize,
    sent: [u8; N],
    answered: [u8; N],
    on_list: [u8; N],
    filed: [bool; N],
    frozen: Option<[bool; N]>,
    files: Option<[bool; N]>,
    window_passed: bool,
    cancel_asked: bool,
    writers: [Writer; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Begin,
    /// A steward submits the line at the cursor (again, if the last one died before advancing).
    Submit,
    Advance,
    Answer(usize),
    Collect(usize),
    Cancel,
    WindowPasses,
    /// A steward seals: finalizing -> completed; cancelling (grace or all in) -> cancelled;
    /// in_progress past the window -> expired.
    Seal,
    Start(usize),
    Read(usize),
    Finish(usize),
    /// Writer 0 dies (its lease lapses); writer 1 never does, standing for the replicas that
    /// keep coming.
    Die,
}

struct BatchModel;

fn seal(b: &mut Batch, ending: Status) {
    if b.sealed.is_none() {
        b.sealed = Some(ending);
        b.frozen = Some(b.filed);
    }
}

impl Model for BatchModel {
    type State = Batch;
    type Action = Move;

    fn init_states(&self) -> Vec<Batch> {
        vec![Batch {
            status: Status::Validating,
            sealed: None,
            cursor: 0,
            sent: [0; N],
            answered: [0; N],
            on_list: [0; N],
            filed: [false; N],
            frozen: None,
            files: None,
            window_passed: false,
            cancel_asked: false,
            writers: [Writer::Idle; 2],
        }]
    }

    fn actions(&self, b: &Batch, out: &mut Vec<Move>) {
        let open = b.sealed.is_none();
        if b.status == Status::Validating {
            out.push(Move::Begin);
        }
        if b.status == Status::InProgress && open && b.cursor < N && b.sent[b.cursor] < 2 {
            out.push(Move::Submit);
        }
        // advance-1.lua records a round trip sent before a cancel came, too.
        let advancing = matches!(b.status, Status::InProgress | Status::Cancelling);
        if advancing && open && b.cursor < N && b.sent[b.cursor] > 0 {
            out.push(Move::Advance);
        }
        for i in 0..N {
            if b.answered[i] < b.sent[i] {
                out.push(Move::Answer(i));
            }
            if b.on_list[i] > 0 {
                out.push(Move::Collect(i));
            }
        }
        if !b.cancel_asked && open && matches!(b.status, Status::Validating | Status::InProgress) {
            out.push(Move::Cancel);
        }
        if !b.window_passed {
            out.push(Move::WindowPasses);
        }
        let sealable = match b.status {
            Status::Finalizing | Status::Cancelling => true,
            Status::InProgress => b.window_passed,
            _ => false,
        };
        if open && sealable {
            out.push(Move::Seal);
        }
        for k in 0..2 {
            match b.writers[k] {
                Writer::Idle if b.sealed.is_some() && !b.status.ended() => out.push(Move::Start(k)),
                Writer::Started => out.push(Move::Read(k)),
                Writer::Read(_) => out.push(Move::Finish(k)),
                _ => {}
            }
        }
        if matches!(b.writers[0], Writer::Started | Writer::Read(_)) {
            out.push(Move::Die);
        }
    }

    fn next_state(&self, b: &Batch, m: Move) -> Option<Batch> {
        let mut b = b.clone();
        match m {
            Move::Begin => b.status = Status::InProgress,
            Move::Submit => b.sent[b.cursor] += 1,
            Move::Advance => b.cursor += 1,
            Move::Answer(i) => {
                b.answered[i] += 1;
                b.on_list[i] += 1;
            }
            // collect-4.lua: file the first result of a line while in_progress or cancelling and
            // not sealed; the last one of an in_progress batch finalizes it, or seals it
            // expired once the window passed.
            Move::Collect(i) => {
                b.on_list[i] -= 1;
                let open = matches!(b.status, Status::InProgress | Status::Cancelling)
                    && b.sealed.is_none();
                if open && !b.filed[i] {
                    b.filed[i] = true;
                    if b.status == Status::InProgress && b.filed.iter().all(|f| *f) {
                        if b.window_passed {
                            seal(&mut b, Status::Expired);
                        } else {
                            b.status = Status::Finalizing;
                        }
                    }
                }
            }
            Move::Cancel => {
                b.cancel_asked = true;
                b.status = Status::Cancelling;
            }
            Move::WindowPasses => b.window_passed = true,
            Move::Seal => {
                let ending = match b.status {
                    Status::Finalizing => Status::Completed,
                    Status::Cancelling => Status::Cancelled,
                    _ => Status::Expired,
                };
                seal(&mut b, ending);
            }
            Move::Start(k) => b.writers[k] = Writer::Started,
            // write_lines: HMGET of the filed results; gone once another finished.
            Move::Read(k) => {
                b.writers[k] = Writer::Read(if b.status.ended() {
                    [false; N]
                } else {
                    b.filed
                })
            }
            // finish-10.lua: the first records its files and the ending; a later one changes nothing.
            Move::Finish(k) => {
                if let Writer::Read(lines) = b.writers[k] {
                    if !b.status.ended() {
                        b.files = Some(lines);
                        b.status = b.sealed.unwrap_or(b.status);
                        b.filed = [false; N];
                    }
                }
                b.writers[k] = Writer::Done;
            }
            Move::Die => b.writers[0] = Writer::Done,
        }
        Some(b)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("sealed results never change", |_, b: &Batch| {
                b.status.ended() || b.frozen.is_none_or(|f| f == b.filed)
            }),
            Property::always(
                "the files hold exactly the frozen results",
                |_, b: &Batch| b.files.is_none_or(|files| Some(files) == b.frozen),
            ),
            Property::always("a completed batch has every result", |_, b: &Batch| {
                b.status != Status::Completed || b.files == Some([true; N])
            }),
            Property::eventually("every batch ends", |_, b: &Batch| b.status.ended()),
            Property::sometimes("completed", |_, b: &Batch| b.status == Status::Completed),
            Property::sometimes("cancelled with partial output", |_, b: &Batch| {
                b.status == Status::Cancelled && b.files.is_some_and(|f| f.iter().any(|x| *x))
            }),
            Property::sometimes("expired with partial output", |_, b: &Batch| {
                b.status == Status::Expired && b.files.is_some_and(|f| f.iter().any(|x| *x))
            }),
            Property::sometimes("a line sent twice, and completed", |_, b: &Batch| {
                b.status == Status::Completed && b.sent.contains(&2)
            }),
            Property::sometimes("a writer read after the batch ended", |_, b: &Batch| {
                b.status.ended()
                    && b.writers
                        .iter()
                        .any(|w| matches!(w, Writer::Read(l) if *l == [false; N]))
            }),
        ]
    }
}

#[test]
fn every_interleaving_of_a_batchs_moves_keeps_one_line_per_line_and_ends() {
    let checker = BatchModel.checker().threads(2).spawn_bfs().join();
    println!("states explored: {}", checker.unique_state_count());
    checker.assert_properties();
    assert!(checker.unique_state_count() > 1000);
}
