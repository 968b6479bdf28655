//! Starting a program under ptrace and running it to the loader's first
//! rendezvous (or to its entry point).

use crate::*;

impl ProcessTarget {
    /// Start `program` with `args` under ptrace, stopped once the dynamic
    /// loader has mapped and relocated its libraries, before any constructor
    /// runs (see [`ProcessTarget::spawn_with`]).
    pub fn spawn(program: &Path, args: &[OsString]) -> Result<Self, ProcessError> {
        Self::spawn_with(program, args, &SpawnOptions::default())
    }

    /// As [`ProcessTarget::spawn`], with the child's standard streams
    /// redirected as `opts` says.
    ///
    /// The process is run from its exec to the dynamic loader's first
    /// `RT_CONSISTENT` rendezvous: the program, its `LD_PRELOAD` and
    /// `DT_NEEDED` libraries and libc are mapped (see /proc/PID/maps) and
    /// relocated, and no constructor (`.preinit_array`, `.init_array`,
    /// `DT_INIT`) of any of them has run; the leader is stopped at
    /// `_dl_debug_state`. Statically linked programs, programs whose loader
    /// has no usable rendezvous, and `opts.stop_at_entry` run to the entry
    /// point (`AT_ENTRY`) instead: the libraries' constructors have run there
    /// (the program's own run later, from `__libc_start_main`).
    /// [`ProcessTarget::stopped_before_constructors`] tells which.
    pub fn spawn_with(
        program: &Path,
        args: &[OsString],
        opts: &SpawnOptions,
    ) -> Result<Self, ProcessError> {
        let redirects: [(Option<i32>, i32); 3] = [
            (opts.stdin.as_ref().map(|f| f.as_raw_fd()), 0),
            (opts.stdout.as_ref().map(|f| f.as_raw_fd()), 1),
            (opts.stderr.as_ref().map(|f| f.as_raw_fd()), 2),
        ];
        let resolved = resolve_program(program).ok_or_else(|| ProcessError::Spawn {
            program: program.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found (nor in PATH)"),
        })?;
        let path_c =
            CString::new(resolved.as_os_str().as_bytes()).map_err(|_| ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"),
            })?;
        let mut argv_c = vec![CString::new(program.as_os_str().as_bytes()).unwrap_or_default()];
        for a in args {
            argv_c.push(CString::new(a.as_bytes()).map_err(|_| ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in argument"),
            })?);
        }
        let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !opts.env.iter().any(|(ok, _)| ok == k))
            .collect();
        env.extend(opts.env.iter().cloned());
        let envp_c: Vec<CString> = env
            .iter()
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        let mut envp: Vec<*const libc::c_char> = envp_c.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());

        let (go_r, go_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        // SAFETY: fork; the child only calls async-signal-safe functions
        // (read, write, execv, _exit) on data prepared before the fork.
        let child = unsafe { libc::fork() };
        if child == -1 {
            return Err(ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        if child == 0 {
            // SAFETY: async-signal-safe calls only, see above.
            unsafe {
                libc::close(go_w);
                libc::close(err_r);
                let mut b = 0u8;
                libc::read(go_r, &mut b as *mut u8 as *mut libc::c_void, 1);
                for (from, to) in redirects {
                    if let Some(fd) = from {
                        libc::dup2(fd, to);
                    }
                }
                libc::execve(path_c.as_ptr(), argv.as_ptr(), envp.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_w, &errno as *const i32 as *const libc::c_void, 4);
                libc::_exit(127);
            }
        }
        close_fd(go_r);
        close_fd(err_w);
        let sys = Sys::real();
        let seized = sys.seize(child, TRACE_OPTIONS | libc::PTRACE_O_EXITKILL);
        // Let the child exec.
        // SAFETY: writing one byte from a live local to our pipe.
        unsafe { libc::write(go_w, b"g".as_ptr() as *const libc::c_void, 1) };
        close_fd(go_w);
        if let Err(e) = seized {
            let _ = sys.kill(child, libc::SIGKILL);
            let _ = sys.waitpid_restart(child, 0);
            close_fd(err_r);
            return Err(e.into());
        }
        let mut errno = 0i32;
        // SAFETY: reading 4 bytes into a live local; returns 0 on CLOEXEC close.
        let n = unsafe { libc::read(err_r, &mut errno as *mut i32 as *mut libc::c_void, 4) };
        close_fd(err_r);
        if n == 4 {
            let _ = sys.waitpid_restart(child, 0);
            return Err(ProcessError::Spawn {
                program: program.display().to_string(),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let mem = open_mem(&sys, child)?;
        let mut t = ProcessTarget::new(child, resolved, mem, true, sys);
        t.threads.insert(child, Thread::new(RunState::Running));
        // Wait for the exec stop.
        loop {
            let (pid, status) = t
                .sys
                .waitpid_restart(child, 0)?
                .expect("blocking waitpid returns a pid");
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                t.attached = false;
                return Err(ProcessError::EndedEarly {
                    program: program.display().to_string(),
                    status: exit_status(status),
                });
            }
            if libc::WIFSTOPPED(status) && status >> 16 == libc::PTRACE_EVENT_EXEC {
                t.threads.get_mut(&pid).expect("leader").state = RunState::Parked;
                break;
            }
            // Anything else before exec (the seize's own stop): keep going.
            t.sys.cont(pid, 0)?;
        }
        // The exec replaced the memory: reopen /proc/PID/mem.
        t.mem = open_mem(&t.sys, child)?;
        t.arm_rendezvous();
        t.learn_sigtrap_state();
        t.run_to_start(opts.stop_at_entry)?;
        Ok(t)
    }

    /// Run from the exec stop to the loader's first `RT_CONSISTENT`
    /// rendezvous of the base namespace (unless `at_entry`), or else to the
    /// program's entry point (AT_ENTRY), which also catches programs
    /// whose loader never reports.
    pub(crate) fn run_to_start(&mut self, at_entry: bool) -> Result<(), ProcessError> {
        let entry =
            rendezvous::read_auxv(self.pid, libc::AT_ENTRY).ok_or_else(|| ProcessError::Spawn {
                program: self.program.display().to_string(),
                source: std::io::Error::other("no AT_ENTRY in /proc/PID/auxv"),
            })?;
        let addr = RuntimeAddr(entry);
        let leader = ThreadId(self.pid as u64);
        self.insert_breakpoint(addr)?;
        self.resume(leader, ResumeMode::Continue)?;
        loop {
            match self.wait(None)? {
                TargetEvent::Breakpoint {
                    thread,
                    addr: a,
                    mut regs,
                } if a == addr => {
                    self.remove_breakpoint(addr)?;
                    regs.rip = entry;
                    self.set_registers(thread, &regs)?;
                    self.threads.get_mut(&self.pid).expect("leader").state = RunState::Parked;
                    return Ok(());
                }
                TargetEvent::ModulesChanged { thread }
                    if !at_entry
                        && thread == leader
                        && self.rendezvous.as_ref().is_some_and(|r| r.base_loaded) =>
                {
                    self.remove_breakpoint(addr)?;
                    self.before_constructors = true;
                    self.threads.get_mut(&self.pid).expect("leader").state = RunState::Parked;
                    return Ok(());
                }
                TargetEvent::Exited(status) => {
                    return Err(ProcessError::EndedEarly {
                        program: self.program.display().to_string(),
                        status,
                    })
                }
                TargetEvent::Breakpoint { thread, .. }
                | TargetEvent::Stepped { thread, .. }
                | TargetEvent::ModulesChanged { thread } => {
                    self.resume(thread, ResumeMode::Continue)?;
                }
                _ => {}
            }
        }
    }
}

fn resolve_program(program: &Path) -> Option<PathBuf> {
    if program.as_os_str().as_bytes().contains(&b'/') {
        return program.exists().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsStr::new("/usr/bin:/bin").to_owned());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn pipe_cloexec() -> Result<(i32, i32), ProcessError> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(ProcessError::Sys(SysError {
            call: "pipe2",
            pid: 0,
            source: std::io::Error::last_os_error(),
        }));
    }
    Ok((fds[0], fds[1]))
}

fn close_fd(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd) };
}
