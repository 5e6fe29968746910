//! Where a process's hand-over socket lives: a directory only its user can write to, so that
//! another local user cannot take the socket's name first (a file, a directory or a link at a
//! predictable path in the shared temporary directory made every upgrade fail) nor replace it.
//!
//! The directory is the first of these that is a directory of this user (not a link) that
//! neither its group nor others can write to:
//!
//! 1. `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`; the first one when it lists several),
//! 2. `$XDG_RUNTIME_DIR` (the per-user `/run/user/UID` of a login session),
//! 3. `clarion-UID` in the temporary directory (`$TMPDIR`, else `/tmp`), created mode 0700;
//!    when another user holds that name, `clarion-UID-1`, `clarion-UID-2`, ... (up to
//!    [`TEMP_CANDIDATES`]).
//!
//! The process that listens creates the directory it needs; the process that connects (a
//! successor started with `--upgrade-from PID`, by the old process or by a group's
//! supervisor, with the same environment) walks the same list without creating anything and
//! so finds the same directory: the names another user holds are passed over by both, and no
//! one but this user can make a name on the list become this user's. The peer's pid and uid
//! are still checked on the socket (`SO_PEERCRED`).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::user::effective_uid as own_uid;

/// How many names in the temporary directory are tried before giving up: each one another
/// user holds costs them a directory, and this many of them only disables upgrades that keep
/// connections (the restart with a drain still works) until an operator removes them.
const TEMP_CANDIDATES: u32 = 16;

/// The socket of the process `pid`, in the first directory on the list that exists. With
/// `create`, a missing directory of the temporary directory is created (mode 0700).
pub fn socket_in(pid: u32, create: bool) -> io::Result<PathBuf> {
    Ok(private_dir(create)?.join(format!("clarion-handover-{pid}.sock")))
}

/// The first directory on the list (see the module doc); with `create`, a missing directory of
/// the temporary directory is created (mode 0700). Other files a process must keep from other
/// local users (a group's nodes file) live there too.
pub fn private_dir(create: bool) -> io::Result<PathBuf> {
    let runtime = std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|v| std::env::split_paths(&v).next())
        .filter(|p| p.is_absolute());
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let env = [runtime, xdg];
    dir(&env, &std::env::temp_dir(), create)
}

/// The first directory of the list: `env` (the runtime directories set), then names in `tmp`.
fn dir(env: &[Option<PathBuf>], tmp: &Path, create: bool) -> io::Result<PathBuf> {
    for d in env.iter().flatten() {
        if fs::symlink_metadata(d).is_ok_and(|m| private(&m)) {
            return Ok(d.clone());
        }
    }
    let uid = own_uid();
    for n in 0..TEMP_CANDIDATES {
        let d = match n {
            0 => tmp.join(format!("clarion-{uid}")),
            n => tmp.join(format!("clarion-{uid}-{n}")),
        };
        match fs::symlink_metadata(&d) {
            Ok(m) if private(&m) => return Ok(d),
            Ok(m) if m.is_dir() && !m.file_type().is_symlink() && m.uid() == uid && create => {
                // Ours, but someone (this user) loosened it: ours to tighten.
                fs::set_permissions(&d, fs::Permissions::from_mode(0o700))?;
                return Ok(d);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(d);
                }
                match fs::DirBuilder::new().mode(0o700).create(&d) {
                    Ok(()) => {}
                    // Made meanwhile: by another process of ours (then it is ours), or by
                    // someone else (then the next name).
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(annotate(&d, e)),
                }
                let m = fs::symlink_metadata(&d).map_err(|e| annotate(&d, e))?;
                if m.is_dir() && !m.file_type().is_symlink() && m.uid() == uid {
                    // The umask may have taken bits away; it never adds any.
                    fs::set_permissions(&d, fs::Permissions::from_mode(0o700))?;
                    return Ok(d);
                }
            }
            Err(e) => return Err(annotate(&d, e)),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} and the {} names after it are held by other users: remove them, or set \
             XDG_RUNTIME_DIR or RUNTIME_DIRECTORY to a private directory",
            tmp.join(format!("clarion-{uid}")).display(),
            TEMP_CANDIDATES - 1
        ),
    ))
}

/// The longest path a unix socket address holds (`sun_path` is 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// A name for the socket at `path` that fits a unix socket address: `path` itself when it is
/// short enough, else `/proc/self/fd/N/NAME` through a descriptor of its directory (a long
/// `$TMPDIR` made every upgrade fail with "path must be shorter than SUN_LEN"). Bind or
/// connect with [`Addressable::path`] while the value lives.
pub fn addressable(path: &Path) -> io::Result<Addressable> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return Ok(Addressable {
            path: path.to_path_buf(),
            _dir: None,
        });
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a socket path", path.display()),
        ));
    };
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| annotate(dir, e))?;
    let short = Path::new("/proc/self/fd")
        .join(std::os::fd::AsRawFd::as_raw_fd(&dir).to_string())
        .join(name);
    if short.as_os_str().len() > SUN_PATH_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: the socket's name is too long", path.display()),
        ));
    }
    Ok(Addressable {
        path: short,
        _dir: Some(dir),
    })
}

/// A socket path short enough to bind or connect to, and the directory it goes through.
pub struct Addressable {
    path: PathBuf,
    _dir: Option<fs::File>,
}

impl Addressable {
    /// The path to give `bind` or `connect`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether `m` (not followed) is a directory of this user that only this user can write to.
fn private(m: &fs::Metadata) -> bool {
    m.is_dir() && !m.file_type().is_symlink() && m.uid() == own_uid() && m.mode() & 0o022 == 0
}

fn annotate(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_is_private_and_names_held_by_others_are_passed_over_by_both_sides() {
        let base = std::env::temp_dir().join(format!("clarion-sockdir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir(&base).unwrap();
        let uid = own_uid();
        let first = base.join(format!("clarion-{uid}"));
        // The connecting side creates nothing; the listening side creates it 0700.
        assert_eq!(dir(&[], &base, false).unwrap(), first);
        assert!(!first.exists());
        assert_eq!(dir(&[], &base, true).unwrap(), first);
        assert_eq!(fs::metadata(&first).unwrap().mode() & 0o7777, 0o700);
        // A name held by a link (or, as root, a directory given to another user) is passed
        // over, by both sides alike.
        fs::remove_dir(&first).unwrap();
        std::os::unix::fs::symlink(&base, &first).unwrap();
        let second = base.join(format!("clarion-{uid}-1"));
        assert_eq!(dir(&[], &base, true).unwrap(), second);
        assert_eq!(dir(&[], &base, false).unwrap(), second);
        if uid == 0 {
            let third = base.join(format!("clarion-{uid}-2"));
            fs::remove_dir(&second).unwrap();
            fs::create_dir(&second).unwrap();
            std::os::unix::fs::chown(&second, Some(65534), None).unwrap();
            assert_eq!(dir(&[], &base, true).unwrap(), third);
            assert_eq!(dir(&[], &base, false).unwrap(), third);
        }
        // A private runtime directory comes first; one writable by others does not count.
        let xdg = base.join("xdg");
        fs::create_dir(&xdg).unwrap();
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o777)).unwrap();
        let env = [None, Some(xdg.clone())];
        assert_ne!(dir(&env, &base, false).unwrap(), xdg);
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(dir(&env, &base, false).unwrap(), xdg);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_socket_in_a_directory_too_deep_for_sun_path_is_bound_and_reached_through_its_descriptor() {
        use std::os::unix::net::{UnixListener, UnixStream};
        let base = std::env::temp_dir().join(format!("clarion-sockdeep-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let deep = base.join("d".repeat(60)).join("e".repeat(60));
        fs::create_dir_all(&deep).unwrap();
        let path = deep.join("clarion-handover-1.sock");
        assert!(path.as_os_str().len() > SUN_PATH_MAX);
        assert!(
            UnixListener::bind(&path).is_err(),
            "too long for a plain bind"
        );
        let name = addressable(&path).unwrap();
        let listener = UnixListener::bind(name.path()).unwrap();
        drop(name);
        assert!(path.exists(), "the socket is made at its real path");
        let _client = UnixStream::connect(addressable(&path).unwrap().path()).unwrap();
        assert!(listener.accept().is_ok());
        // A short path is used as it is.
        let short = Path::new("/tmp/x.sock");
        assert_eq!(addressable(short).unwrap().path(), short);
        fs::remove_dir_all(&base).unwrap();
    }
}
