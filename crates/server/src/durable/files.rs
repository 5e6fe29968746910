//! The history directory's safety, OpenSSH-style: the directory is private to the user the
//! server runs as (mode 0700, owned by it, never a symbolic link), every file in it is created
//! mode 0600 and opened with `O_NOFOLLOW`, so no other local user can read the history, plant
//! a file the server will trust, or make it write through a link to a file of someone else's.
//! Modes are set explicitly after creation (`fchmod`), so they do not depend on the umask.
//!
//! What this module does not own: what the files hold (`super` and `recover`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::Path;

use crate::user::effective_uid as own_uid;

/// The directory's mode: only its owner may list, read or create files in it.
const DIR_MODE: u32 = 0o700;
/// Every file's mode: only its owner may read or write it.
const FILE_MODE: u32 = 0o600;
/// Group and other write bits: a directory with either can have files planted or replaced.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// Makes sure `dir` is a private directory of this user: creates it (and missing parents)
/// mode 0700 when it does not exist; refuses one that is a symbolic link, not a directory, not
/// owned by the server's effective user, or writable by group or others (the error says what is
/// wrong and how to fix it). One of this user's that others can only read or enter (0755, as
/// Clarion before 0.1 made it) is tightened to 0700; `Ok(Some(old mode))` says so.
pub fn private_dir(dir: &Path) -> io::Result<Option<u32>> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)?;
            fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
            fs::symlink_metadata(dir)?
        }
        Err(e) => return Err(e),
    };
    check_dir(&meta)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode & !0o077))?;
    Ok(Some(mode))
}

/// Why `meta` (of the history directory, not followed) is not a private directory of ours.
fn check_dir(meta: &fs::Metadata) -> io::Result<()> {
    let own = own_uid();
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    if meta.file_type().is_symlink() {
        return refuse(
            "is a symbolic link, which the server does not follow (another user could point it \
             elsewhere): set history_dir to the directory itself"
                .into(),
        );
    }
    if !meta.is_dir() {
        return refuse("is not a directory".into());
    }
    if meta.uid() != own {
        return refuse(format!(
            "is owned by uid {}, not by uid {own} that runs the server, so that user could read \
             or replace the history: use a directory of this user (`chown {own}` it, or choose \
             another path)",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & WRITABLE_BY_OTHERS != 0 {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "its group",
            (false, true) => "others",
            (false, false) => "nobody",
        };
        return refuse(format!(
            "is writable by {who} (mode {mode:04o}), who could plant or replace history files: \
             `chmod 700` it (after checking what it holds)"
        ));
    }
    Ok(())
}

/// Opens an existing file of the directory, never through a symbolic link, and checks that it
/// is a regular file of ours (a looser mode left by an older version is tightened to 0600).
pub fn open_existing(path: &Path, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| explain(path, e))?;
    checked(path, file)
}

/// Opens `path` for reading and writing, creating it (mode 0600) if it does not exist; never
/// through a symbolic link.
pub fn open_or_create(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| explain(path, e))?;
    checked(path, file)
}

/// Creates `path` (mode 0600), which must not exist, for appending. `O_EXCL` never follows a
/// link nor reuses a file someone else made.
pub fn create_new(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| explain(path, e))?;
    file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Creates `path` (mode 0600) afresh: whatever is there (a file left by a crash, or a link) is
/// removed first, never followed.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    create_new(path)
}

/// Opens the directory itself (to `fsync` it), never through a symbolic link.
pub fn open_dir(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| explain(dir, e))
}

/// `file` (opened from `path`) if it is a regular file of ours, its mode tightened to 0600.
fn checked(path: &Path, file: File) -> io::Result<File> {
    let meta = file.metadata()?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}", path.display()),
        ))
    };
    if !meta.file_type().is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else if meta.file_type().is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return refuse(format!("is {kind}: remove it"));
    }
    if meta.uid() != own_uid() {
        return refuse(format!(
            "is owned by uid {}, not by uid {} that runs the server: remove it",
            meta.uid(),
            own_uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// An open error with what it means here: `ELOOP` under `O_NOFOLLOW` is a symbolic link.
fn explain(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link, which the server never follows (it could make the \
                 server overwrite another file): remove it",
                path.display()
            ),
        );
    }
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("clarion-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_directory_is_0700_and_new_files_0600_whatever_the_umask() {
        let d = scratch("new").join("a/b");
        assert_eq!(private_dir(&d).unwrap(), None);
        assert_eq!(mode(&d), 0o700);
        create_new(&d.join("x.seg")).unwrap();
        open_or_create(&d.join("lock")).unwrap();
        assert_eq!(mode(&d.join("x.seg")), 0o600);
        assert_eq!(mode(&d.join("lock")), 0o600);
        fs::remove_dir_all(d.parent().unwrap().parent().unwrap()).unwrap();
    }

    #[test]
    fn a_directory_readable_by_others_is_tightened_and_one_writable_by_others_refused() {
        let d = scratch("modes");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(private_dir(&d).unwrap(), Some(0o755));
        assert_eq!(mode(&d), 0o700);
        for (m, who) in [
            (0o770, "its group"),
            (0o703, "others"),
            (0o777, "group and others"),
        ] {
            fs::set_permissions(&d, fs::Permissions::from_mode(m)).unwrap();
            let e = private_dir(&d).unwrap_err().to_string();
            assert!(e.contains(&format!("writable by {who}")), "{e}");
            assert!(e.contains("chmod 700"), "{e}");
            assert_eq!(mode(&d), m, "a refused directory is left as it is");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_are_never_followed() {
        let d = scratch("links");
        fs::create_dir(&d).unwrap();
        let target = d.join("target");
        fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, d.join("lock")).unwrap();
        let e = open_or_create(&d.join("lock")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        std::os::unix::fs::symlink(&target, d.join("1.seg")).unwrap();
        assert!(open_existing(&d.join("1.seg"), false).is_err());
        let e = create_new(&d.join("1.seg")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let link = scratch("links-dir");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = private_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        fs::remove_file(&link).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_left_readable_by_others_is_tightened_when_opened() {
        let d = scratch("loose");
        fs::create_dir(&d).unwrap();
        let f = d.join("1.seg");
        fs::write(&f, b"x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        open_existing(&f, false).unwrap();
        assert_eq!(mode(&f), 0o600);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if own_uid() != 0 {
            // Only root can give a directory away; CI runs as root.
            return;
        }
        let d = scratch("owner");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), None).unwrap();
        let e = private_dir(&d).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }
}
