//! `Session::put_files` against the real daemon: the runner unpacks the files itself (the
//! session's interpreter runs nothing), replaces what the code left where a file goes
//! without following it, refuses what it cannot write and keeps the session either way.

use crate::common;

use std::time::Duration;

use mcp_code_executor::backend::docker::DockerBackend;
use mcp_code_executor::backend::{Backend, Session};
use mcp_code_executor::job::{InputFile, JobSpec, Limits, Outcome};

const T: Duration = Duration::from_secs(20);

fn file(path: &str, contents: &[u8]) -> InputFile {
    InputFile {
        path: path.into(),
        contents: contents.to_vec(),
    }
}

async fn open(sb: &DockerBackend, tenant: &str, limits: Limits) -> Box<dyn Session> {
    let mut job = JobSpec::python("", limits);
    job.files = vec![file("first.txt", b"from the job")];
    job.tenant = tenant.into();
    job.return_files = true;
    sb.open_session(job).await.expect("session")
}

async fn cell(s: &mut Box<dyn Session>, code: &str) -> Outcome {
    let o = s
        .exec(code, T, None)
        .await
        .unwrap_or_else(|e| panic!("{code:?}: {e}"));
    assert!(o.success(), "{code:?}: {o:?}");
    o
}

#[tokio::test]
async fn files_arrive_without_running_anything_in_the_interpreter() {
    let sb = common::sandbox().await;
    let _cleanup = common::remove_on_drop("t-put-files");
    let mut s = open(&sb, "t-put-files", Limits::default()).await;
    // Every audit event of the interpreter is counted: a cell costs the same number each
    // time, and files put in between must cost none.
    cell(
        &mut s,
        "import sys\nevents = []\nsys.addaudithook(lambda e, a: events.append(e))\nx = 41",
    )
    .await;
    let n1: usize = cell(&mut s, "len(events)")
        .await
        .stdout_text()
        .trim()
        .parse()
        .unwrap();
    let n2: usize = cell(&mut s, "len(events)")
        .await
        .stdout_text()
        .trim()
        .parse()
        .unwrap();
    s.put_files(
        &[
            file("data/in.csv", b"a,b\n1,2\n"),
            file("first.txt", b"changed"),
        ],
        T,
    )
    .await
    .expect("put_files");
    let o = cell(&mut s, "len(events)").await;
    let n3: usize = o.stdout_text().trim().parse().unwrap();
    assert_eq!(
        n3 - n2,
        n2 - n1,
        "the interpreter ran something for put_files"
    );
    let o = cell(
        &mut s,
        "print(x + 1)\nprint(open('data/in.csv').read(), end='')\nprint(open('first.txt').read())",
    )
    .await;
    assert_eq!(o.stdout_text(), "42\na,b\n1,2\nchanged\n");
    // Files the server put in are not returned as the code's own changes.
    assert!(o.files.is_empty(), "{:?}", o.files);
    assert!(s.alive());
    drop(s);
    common::assert_clean(&sb, "t-put-files").await;
}

#[tokio::test]
async fn what_the_code_left_is_replaced_never_followed() {
    let sb = common::sandbox().await;
    let _cleanup = common::remove_on_drop("t-put-files-links");
    let mut s = open(&sb, "t-put-files-links", Limits::default()).await;
    cell(
        &mut s,
        "import os\nos.symlink('/tmp/target', 'link.txt')\nos.mkfifo('fifo.txt')\nos.symlink('/tmp', 'sub')",
    )
    .await;
    // A symlink and a FIFO where a file goes are replaced by the file; nothing blocks.
    s.put_files(&[file("link.txt", b"L"), file("fifo.txt", b"F")], T)
        .await
        .expect("put_files");
    let o = cell(
        &mut s,
        "import stat\nprint(os.path.exists('/tmp/target'), os.path.islink('link.txt'), open('link.txt').read())\nprint(stat.S_ISREG(os.lstat('fifo.txt').st_mode), open('fifo.txt').read())",
    )
    .await;
    assert_eq!(o.stdout_text(), "False False L\nTrue F\n");
    // A directory that is a symlink is not gone through: refused, the session goes on.
    let err = s
        .put_files(&[file("sub/escaped.txt", b"x")], T)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("could not write sub/escaped.txt"),
        "{err}"
    );
    assert!(s.alive());
    let o = cell(&mut s, "print(os.path.exists('/tmp/escaped.txt'))").await;
    assert_eq!(o.stdout_text(), "False\n");
    drop(s);
    common::assert_clean(&sb, "t-put-files-links").await;
}

#[tokio::test]
async fn a_full_workspace_is_an_error_and_the_session_goes_on() {
    let sb = common::sandbox().await;
    let _cleanup = common::remove_on_drop("t-put-files-full");
    let limits = Limits {
        workspace_bytes: 1 << 20,
        ..Limits::default()
    };
    let mut s = open(&sb, "t-put-files-full", limits).await;
    cell(&mut s, "y = 'kept'").await;
    let err = s
        .put_files(&[file("big.bin", &vec![7u8; 2 << 20])], T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert!(s.alive());
    let o = cell(&mut s, "print(y)").await;
    assert_eq!(o.stdout_text(), "kept\n");
    drop(s);
    common::assert_clean(&sb, "t-put-files-full").await;
}
