use super::*;
use std::collections::HashMap;
use std::sync::mpsc;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn gpus_parse_and_resolve() {
    assert_eq!("2".parse::<Gpus>().unwrap(), Gpus::Count(2));
    assert_eq!("all".parse::<Gpus>().unwrap(), Gpus::All);
    assert_eq!("0,2".parse::<Gpus>().unwrap(), Gpus::List(vec![0, 2]));
    for (bad, want) in [
        ("0", "a count of at least 1"),
        (",", "`` is not a GPU index"),
        ("1,1", "GPU 1 is named twice"),
        ("two", "a count of at least 1"),
        ("0,x", "`x` is not a GPU index"),
        ("-1", "a count of at least 1"),
    ] {
        let e = bad.parse::<Gpus>().unwrap_err();
        assert!(
            e.contains(want) && e.starts_with(&format!("--gpus {bad}")),
            "{bad}: {e}"
        );
    }
    assert_eq!(Gpus::All.resolve(Ok(3)).unwrap(), vec![0, 1, 2]);
    assert_eq!(Gpus::Count(2).resolve(Ok(4)).unwrap(), vec![0, 1]);
    assert_eq!(Gpus::List(vec![3, 1]).resolve(Ok(4)).unwrap(), vec![3, 1]);
    let e = Gpus::Count(2)
        .resolve(Err("no NVIDIA driver found".into()))
        .unwrap_err();
    assert_eq!(e, "--gpus 2: no CUDA GPU found (no NVIDIA driver found)");
    assert!(Gpus::All
        .resolve(Ok(0))
        .unwrap_err()
        .contains("no CUDA GPU found"));
    let e = Gpus::Count(4).resolve(Ok(2)).unwrap_err();
    assert!(e.contains("this host has 2 GPUs (indices 0 to 1)"), "{e}");
    let e = Gpus::List(vec![0, 2]).resolve(Ok(2)).unwrap_err();
    assert!(
        e.contains("there is no GPU 2") && e.contains("0 to 1"),
        "{e}"
    );
}

#[test]
fn launcher_variables_describe_the_world() {
    let t = env(&[
        ("WORLD_SIZE", "4"),
        ("RANK", "3"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "node7"),
        ("MASTER_PORT", "29500"),
    ]);
    let w = from_env(&t, None).unwrap().unwrap();
    assert_eq!(
        (w.rank, w.size, w.local_rank, w.launcher),
        (3, 4, 1, "torchrun")
    );
    assert_eq!(
        w.rendezvous,
        Rendezvous::Tcp {
            host: "node7".into(),
            port: 29500
        }
    );
    // A task of an srun step.
    let s = env(&[
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "1"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_ID", "0"),
    ]);
    let f: Rendezvous = "file:/shared/j.rdv".parse().unwrap();
    let w = from_env(&s, Some(&f)).unwrap().unwrap();
    assert_eq!((w.rank, w.size, w.launcher), (1, 2, "slurm"));
    assert_eq!(w.rendezvous, f);
    // No launcher, or a world of one: a plain run.
    assert_eq!(from_env(&env(&[]), None).unwrap(), None);
    assert_eq!(
        from_env(&env(&[("WORLD_SIZE", "1"), ("RANK", "0")]), None).unwrap(),
        None
    );
}

#[test]
fn inconsistent_variables_are_named() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("WORLD_SIZE", "2")], "RANK is not"),
        (&[("WORLD_SIZE", "two"), ("RANK", "0")], "WORLD_SIZE=two"),
        (&[("WORLD_SIZE", "2"), ("RANK", "2")], "rank 2 is not below"),
        (&[("WORLD_SIZE", "0"), ("RANK", "0")], "world size is 0"),
        (&[("WORLD_SIZE", "2"), ("RANK", "1")], "MASTER_ADDR"),
        (
            &[
                ("WORLD_SIZE", "2"),
                ("RANK", "1"),
                ("MASTER_ADDR", "a"),
                ("MASTER_PORT", "99999"),
            ],
            "MASTER_PORT=99999",
        ),
        (
            &[("SLURM_NTASKS", "2"), ("SLURM_STEP_ID", "0")],
            "SLURM_PROCID",
        ),
        (
            &[("WORLD_SIZE", "2"), ("JOB_COMPLETION_INDEX", "x")],
            "JOB_COMPLETION_INDEX=x",
        ),
    ];
    for (vars, want) in cases {
        let e = from_env(&env(vars), None).unwrap_err();
        assert!(e.contains(want), "{vars:?}: {e}");
    }
    for bad in ["file:", "tcp:host", "tcp:h:port", "nfs:/x"] {
        assert!(bad.parse::<Rendezvous>().is_err(), "{bad}");
    }
}

/// Slurm's batch script has the allocation's SLURM_NTASKS and SLURM_PROCID=0 but no step id:
/// it is one process, not rank 0 of a world. An srun step's tasks have SLURM_STEP_ID.
#[test]
fn a_slurm_batch_script_is_not_a_world() {
    let base = [
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_LOCALID", "0"),
        ("MASTER_ADDR", "node1"),
        ("MASTER_PORT", "29500"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        env(&v)
    };
    // srun's tasks join, whichever name of the step id the Slurm version sets.
    for step in [("SLURM_STEP_ID", "0"), ("SLURM_STEPID", "3")] {
        let w = from_env(&with(&[step]), None).unwrap().unwrap();
        assert_eq!((w.rank, w.size, w.launcher), (0, 2, "slurm"), "{step:?}");
        assert_eq!(w.join_timeout, JOIN_TIMEOUT);
    }
    // The batch script: no step id, or the batch step's reserved ids.
    for extra in [
        &[][..],
        &[("SLURM_STEP_ID", "batch")],
        &[("SLURM_STEP_ID", "4294967291")],
        &[("SLURM_STEPID", "-2")],
    ] {
        let e = from_env(&with(extra), None).unwrap_err();
        assert!(
            e.contains("SLURM_NTASKS=2") && e.contains("not one of srun's tasks"),
            "{extra:?}: {e}"
        );
        assert!(e.contains("`srun prep train ...`"), "{e}");
        assert!(in_slurm_allocation_shell(&with(extra)), "{extra:?}");
    }
    assert!(!in_slurm_allocation_shell(&with(&[("SLURM_STEP_ID", "0")])));
    // A batch script of one task is a plain run.
    let one = env(&[("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0")]);
    assert_eq!(from_env(&one, None).unwrap(), None);
    assert!(!in_slurm_allocation_shell(&one));
    // torchrun inside a batch script: its variables describe the world.
    let mut t = base.to_vec();
    t.extend([("WORLD_SIZE", "2"), ("RANK", "1")]);
    let w = from_env(&env(&t), None).unwrap().unwrap();
    assert_eq!((w.rank, w.launcher), (1, "torchrun"));
    assert!(!in_slurm_allocation_shell(&env(&t)));
}

/// A Kubernetes indexed Job's pod: WORLD_SIZE from the manifest, the rank from the
/// JOB_COMPLETION_INDEX that Kubernetes sets; RANK, where set, wins.
#[test]
fn an_indexed_job_gives_the_rank() {
    let k = [
        ("WORLD_SIZE", "4"),
        ("JOB_COMPLETION_INDEX", "2"),
        ("MASTER_ADDR", "prep-train-0.prep-train"),
        ("MASTER_PORT", "29500"),
    ];
    let w = from_env(&env(&k), None).unwrap().unwrap();
    assert_eq!(
        (w.rank, w.size, w.local_rank, w.launcher),
        (2, 4, 0, "Kubernetes indexed Job")
    );
    let mut r = k.to_vec();
    r.push(("RANK", "3"));
    let w = from_env(&env(&r), None).unwrap().unwrap();
    assert_eq!((w.rank, w.local_rank, w.launcher), (3, 3, "torchrun"));
    let e = from_env(
        &env(&[("WORLD_SIZE", "4"), ("JOB_COMPLETION_INDEX", "4")]),
        None,
    )
    .unwrap_err();
    assert!(e.contains("rank 4 is not below the world size 4"), "{e}");
    // Without WORLD_SIZE, an indexed Job (prep synth --part, say) is no world.
    assert_eq!(
        from_env(&env(&[("JOB_COMPLETION_INDEX", "2")]), None).unwrap(),
        None
    );
}

#[test]
fn the_rendezvous_timeout_is_read_and_checked() {
    let base = [
        ("WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "29500"),
    ];
    let with = |v: &'static str| {
        let mut e = base.to_vec();
        e.push((TIMEOUT_VAR, v));
        env(&e)
    };
    let w = from_env(&with(" 1200 "), None).unwrap().unwrap();
    assert_eq!(w.join_timeout, Duration::from_secs(1200));
    for bad in [
        "0",
        "-5",
        "ten",
        "1.5",
        "",
        "99999999999999999999",
        "604801",
    ] {
        let e = from_env(&with(bad), None).unwrap_err();
        assert!(
            e.starts_with(&format!("{TIMEOUT_VAR}={bad} is not a number of seconds"))
                && e.contains("default 300"),
            "{bad}: {e}"
        );
    }
    // A one-process run ignores it.
    let one = env(&[("WORLD_SIZE", "1"), ("RANK", "0"), (TIMEOUT_VAR, "x")]);
    assert_eq!(from_env(&one, None).unwrap(), None);
}

/// A rank > 0 whose rank 0 never comes fails after PREP_RENDEZVOUS_TIMEOUT, naming what it
/// waited on, for how long, and the variable that lengthens the wait.
#[test]
fn a_rank_without_rank_0_gives_up_after_the_timeout() {
    let t = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let tcp = Rendezvous::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let file = Rendezvous::File(t.path().join("job.rdv"));
    for (r, names) in [
        (
            &tcp,
            format!("could not reach rank 0 at 127.0.0.1:{port} within 1 s"),
        ),
        (
            &file,
            format!(
                "rank 0 did not write {} within 1 s",
                t.path().join("job.rdv").display()
            ),
        ),
    ] {
        let mut w = world(1, 2, r);
        w.join_timeout = Duration::from_secs(1);
        let t0 = Instant::now();
        let e = join(&w, "job", || unreachable!()).err().unwrap();
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(took >= Duration::from_secs(1), "{took:?}");
        assert!(e.contains(&names), "{e}");
        assert!(e.contains("set PREP_RENDEZVOUS_TIMEOUT=SECONDS"), "{e}");
    }
    // Rank 0 whose ranks never come says which are missing.
    let mut w = world(0, 3, &tcp);
    w.join_timeout = Duration::from_secs(1);
    let e = join(&w, "job", || Ok(vec![1])).err().unwrap();
    assert!(
        e.contains(&format!(
            "ranks [1, 2] did not join on port {port} within 1 s"
        )) && e.contains("PREP_RENDEZVOUS_TIMEOUT"),
        "{e}"
    );
}

fn world(rank: usize, size: usize, r: &Rendezvous) -> World {
    World {
        rank,
        size,
        local_rank: rank,
        rendezvous: r.clone(),
        launcher: "torchrun",
        join_timeout: JOIN_TIMEOUT,
    }
}

/// Three ranks in threads join through TCP and through a file; all get rank 0's payload.
#[test]
fn ranks_join_and_share_the_payload() {
    let t = tempfile::tempdir().unwrap();
    let rdvs = [
        Rendezvous::Tcp {
            host: "127.0.0.1".into(),
            port: free_port().unwrap(),
        },
        Rendezvous::File(t.path().join("job.rdv")),
    ];
    for r in rdvs {
        let hs: Vec<_> = (0..3)
            .rev()
            .map(|rank| {
                let w = world(rank, 3, &r);
                std::thread::spawn(move || {
                    let j = join(&w, "job", || Ok(vec![7, 0, 255, 42])).unwrap();
                    (rank, j.payload.clone(), j.links.len())
                })
            })
            .collect();
        for h in hs {
            let (rank, p, links) = h.join().unwrap();
            assert_eq!(p, vec![7, 0, 255, 42], "rank {rank}");
            assert_eq!(links, if rank == 0 { 2 } else { 1 });
        }
        if let Rendezvous::File(p) = &r {
            assert!(!p.exists(), "rank 0 removes its rendezvous file");
        }
    }
}

#[test]
fn a_rank_of_another_job_is_refused() {
    let r = Rendezvous::Tcp {
        host: "127.0.0.1".into(),
        port: free_port().unwrap(),
    };
    let w0 = world(0, 2, &r);
    let h = std::thread::spawn(move || join(&w0, "job-a", || Ok(vec![1])).map(|_| ()));
    let w1 = world(1, 2, &r);
    let e1 = join(&w1, "job-b", || unreachable!()).err().unwrap();
    let e0 = h.join().unwrap().unwrap_err();
    assert!(e0.contains("runs another job"), "{e0}");
    assert!(e1.contains("closed the connection"), "{e1}");
}

/// A rank that dies (its socket closes) or says why it stops is reported to every other rank.
#[test]
fn the_end_of_one_rank_reaches_every_other() {
    for say_why in [false, true] {
        let r = Rendezvous::Tcp {
            host: "127.0.0.1".into(),
            port: free_port().unwrap(),
        };
        let (tx, rx) = mpsc::channel::<(usize, Ended)>();
        let hs: Vec<_> = (0..3)
            .map(|rank| {
                let w = world(rank, 3, &r);
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let j = join(&w, "job", || Ok(vec![1])).unwrap();
                    let mut watch = j
                        .watch(move |e| {
                            let _ = tx.send((rank, e));
                        })
                        .unwrap();
                    if rank == 2 {
                        if say_why {
                            watch.fail("damaged block 3 of train-00001.shard");
                        }
                        j.sever();
                    } else {
                        std::thread::sleep(Duration::from_secs(2));
                    }
                })
            })
            .collect();
        // (Rank 2's own watcher sees its severed links too; a dead process would not.)
        let mut seen: Vec<(usize, Ended)> = Vec::new();
        while seen.len() < 2 {
            let (who, e) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            if who != 2 {
                seen.push((who, e));
            }
        }
        seen.sort_by_key(|s| s.0);
        assert_eq!(seen[0].0, 0);
        assert_eq!(seen[1].0, 1);
        for (_, e) in &seen {
            assert_eq!(e.rank, 2);
            if say_why {
                assert_eq!(e.reason, "damaged block 3 of train-00001.shard");
            } else {
                assert!(e.reason.contains("without a word"), "{}", e.reason);
            }
        }
        for h in hs {
            h.join().unwrap();
        }
    }
}

#[test]
fn a_normal_finish_raises_no_alarm() {
    let r = Rendezvous::Tcp {
        host: "127.0.0.1".into(),
        port: free_port().unwrap(),
    };
    let (tx, rx) = mpsc::channel::<Ended>();
    let hs: Vec<_> = (0..2)
        .map(|rank| {
            let w = world(rank, 2, &r);
            let tx = tx.clone();
            std::thread::spawn(move || {
                let j = join(&w, "job", || Ok(vec![1])).unwrap();
                let watch = j
                    .watch(move |e| {
                        let _ = tx.send(e);
                    })
                    .unwrap();
                watch.finish();
                std::thread::sleep(Duration::from_millis(300));
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
}
