//! Tests of the storage directory and its files (one principal's scope: `owners`).

use super::super::test_support::{tempdir, tmp};
use super::*;

#[tokio::test]
async fn planted_symlink_is_refused_not_followed() {
    let (d, s) = tmp();
    let secret = d.path().join("secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, s.dir().join("evil.py")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", s.dir().join("passwd.py")).unwrap();
    for name in ["evil.py", "passwd.py"] {
        let e = s.read(name).await.unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = s.append(name, "x").await.unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret");
}

#[tokio::test]
async fn a_symlinked_storage_dir_is_accepted_under_both_spellings() {
    let d = tempdir::Dir::new();
    std::fs::create_dir(d.path().join("real")).unwrap();
    std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).unwrap();
    let s = CodeStorage::open(d.path().join("link")).unwrap();
    let p = s.create(Some("x"), "print(1)\n").await.unwrap();
    let name = p.file_name().unwrap().to_str().unwrap();
    let via_link = d.path().join("link").join(name);
    let (_, text) = s.read(via_link.to_str().unwrap()).await.unwrap();
    assert_eq!(text, "print(1)\n");
}

#[tokio::test]
async fn create_append_read() {
    let (_d, s) = tmp();
    let p = s.create(Some("my_script"), "a = 1\n").await.unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("my_script_") && name.ends_with(".py"),
        "{name}"
    );
    let (_, size) = s.append(&name, "b = 2\n").await.unwrap();
    assert_eq!(size, 12);
    let (_, text) = s.read(p.to_str().unwrap()).await.unwrap();
    assert_eq!(text, "a = 1\nb = 2\n");
    let e = s.read("missing.py").await.unwrap_err().to_string();
    assert!(e.contains("does not exist"), "{e}");
    let p2 = s.create(Some("my_script"), "").await.unwrap();
    assert_ne!(p, p2, "unique suffixes");
}

#[tokio::test]
async fn size_caps_hold() {
    let (_d, s) = tmp();
    let big = "x".repeat(defaults::MAX_CODE_BYTES + 1);
    assert!(s.create(None, &big).await.is_err());
    let p = s.create(None, "").await.unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_string();
    let chunk = "y".repeat(defaults::MAX_CODE_BYTES);
    for _ in 0..8 {
        s.append(&name, &chunk).await.unwrap();
    }
    let e = s.append(&name, "z").await.unwrap_err().to_string();
    assert!(e.contains("limit"), "{e}");
}

#[tokio::test]
async fn concurrent_appends_never_interleave() {
    let (_d, s) = tmp();
    let s = Arc::new(s);
    let p = s.create(Some("c"), "").await.unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_string();
    let mut tasks = Vec::new();
    for i in 0..32u8 {
        let s = s.clone();
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let line = format!(
                "{}\n",
                ((b'a' + (i % 26)) as char).to_string().repeat(20_000)
            );
            s.append(&name, &line).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, text) = s.read(&name).await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 32);
    for l in lines {
        assert_eq!(l.len(), 20_000);
        let c = l.as_bytes()[0];
        assert!(l.bytes().all(|b| b == c), "an append was interleaved");
    }
}

#[tokio::test]
async fn a_replacement_is_never_seen_half_written() {
    let (_d, s) = tmp();
    let s = Arc::new(s.with_max_file_bytes(8 << 20));
    let size = 4 << 20;
    s.write_bytes("f.bin", &vec![b'a'; size]).await.unwrap();
    let writer = tokio::spawn({
        let s = s.clone();
        async move {
            for i in 0..12 {
                let byte = if i % 2 == 0 { b'b' } else { b'a' };
                s.write_bytes("f.bin", &vec![byte; size]).await.unwrap();
            }
        }
    });
    let mut reads = 0;
    while !writer.is_finished() {
        let (_, data) = s.read_bytes("f.bin").await.unwrap();
        assert_eq!(data.len(), size, "a partial file was read");
        assert!(
            data.iter().all(|b| *b == data[0]),
            "a mix of two versions was read"
        );
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 0);
    assert_eq!(
        s.list().await.unwrap(),
        vec![("f.bin".to_string(), size as u64)]
    );
    assert_eq!(s.lock_entries(), 0, "the lock map keeps unused entries");
}

#[tokio::test]
async fn a_refused_replacement_keeps_the_old_content() {
    let (d, s) = tmp();
    let quota = Arc::new(StorageQuota::new(100, vec![s.dir().to_path_buf()]));
    s.set_quota(quota);
    s.write_bytes("keep.txt", b"old content").await.unwrap();
    let e = s.write_bytes("keep.txt", &[b'x'; 200]).await.unwrap_err();
    assert!(matches!(e, StorageError::Quota { .. }), "{e}");
    let (_, data) = s.read_bytes("keep.txt").await.unwrap();
    assert_eq!(data, b"old content");
    // Refused as a new file: no empty file is left behind.
    let e = s.write_bytes("new.txt", &[b'x'; 200]).await.unwrap_err();
    assert!(matches!(e, StorageError::Quota { .. }), "{e}");
    assert!(!s.dir().join("new.txt").exists());
    // A failed write (here: the target is a directory) leaves no temporary file.
    std::fs::create_dir(s.dir().join("sub")).unwrap();
    let e = s.write_bytes("sub", b"x").await.unwrap_err();
    assert!(matches!(e, StorageError::NotRegular { .. }), "{e}");
    // Planted links are refused, not followed or replaced.
    let outside = d.path().join("outside.txt");
    std::fs::write(&outside, "untouched").unwrap();
    std::os::unix::fs::symlink(&outside, s.dir().join("link")).unwrap();
    let e = s.write_bytes("link", b"x").await.unwrap_err();
    assert!(matches!(e, StorageError::Symlink { .. }), "{e}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
    let names: Vec<String> = std::fs::read_dir(s.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with(TEMP_PREFIX)),
        "{names:?}"
    );
    // The temporary names are not the clients' to use.
    let e = s
        .write_bytes(&format!("{TEMP_PREFIX}x"), b"x")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("reserved"), "{e}");
    assert_eq!(s.lock_entries(), 0);
}

#[tokio::test]
async fn reads_never_see_half_an_append() {
    let (_d, s) = tmp();
    let s = Arc::new(s);
    let p = s.create(Some("grow"), "").await.unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_string();
    let chunk = "z".repeat(defaults::MAX_CODE_BYTES);
    let writer = tokio::spawn({
        let (s, name) = (s.clone(), name.clone());
        async move {
            for _ in 0..6 {
                s.append(&name, &chunk).await.unwrap();
            }
        }
    });
    while !writer.is_finished() {
        let (_, data) = s.read_bytes(&name).await.unwrap();
        assert_eq!(
            data.len() % defaults::MAX_CODE_BYTES,
            0,
            "part of an append was read"
        );
    }
    writer.await.unwrap();
    assert_eq!(s.lock_entries(), 0);
}

/// A stamp changes with every write, also one of the same bytes (a session skips reading a
/// workspace file whose stamp it has seen), and with an append; reading and listing leave it.
#[tokio::test]
async fn a_stamp_changes_with_each_write_and_only_then() {
    let (_d, s) = tmp();
    s.write_bytes("a.csv", b"1,2\n").await.unwrap();
    s.write_bytes("b.csv", b"3,4\n").await.unwrap();
    let stamp = |all: &[(String, Stamp)], name: &str| {
        all.iter()
            .find(|(n, _)| n == name)
            .map(|(_, st)| *st)
            .unwrap()
    };
    let first = s.stamps().await.unwrap();
    assert_eq!(first.len(), 2);
    s.read_bytes("a.csv").await.unwrap();
    assert_eq!(s.stamps().await.unwrap(), first, "a read changes nothing");
    s.write_bytes("a.csv", b"1,2\n").await.unwrap();
    let second = s.stamps().await.unwrap();
    assert_ne!(
        stamp(&second, "a.csv"),
        stamp(&first, "a.csv"),
        "same bytes, new write"
    );
    assert_eq!(stamp(&second, "b.csv"), stamp(&first, "b.csv"));
    s.append("b.csv", "5,6\n").await.unwrap();
    let third = s.stamps().await.unwrap();
    assert_ne!(stamp(&third, "b.csv"), stamp(&second, "b.csv"), "an append");
    assert_eq!(
        s.list().await.unwrap(),
        vec![("a.csv".to_string(), 4), ("b.csv".to_string(), 8)]
    );
}
