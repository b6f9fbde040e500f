use super::outln;
use super::thousands;
use crate::cli::MergeArgs;
use anyhow::Context;
use prep::util::mem::human;
use std::process::ExitCode;

pub fn run(a: MergeArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    // `prep merge s/ s1/` with OUT forgotten takes s/ for OUT: say so rather than miss a part.
    if super::paths::what(&a.out) == super::paths::What::Dataset {
        return Err(super::UsageError(format!(
            "{} already holds a dataset, and merge writes into its first argument: prep merge OUT PART... (e.g. prep merge merged/ {} {})",
            prep::util::error::shown_path(&a.out),
            prep::util::error::shown_path(&a.out),
            a.parts
                .iter()
                .map(|p| prep::util::error::shown_path(p))
                .collect::<Vec<_>>()
                .join(" ")
        ))
        .into());
    }
    for p in &a.parts {
        if prep::store::remote::is_url(p) {
            return Err(super::UsageError(format!(
                "{}: merge joins parts on a local disk (it links or copies their shards); copy the parts there first, the merged dataset can go to a store with OUT as a URL",
                p.display()
            ))
            .into());
        }
        super::paths::expect_dataset(p, "merge takes OUT then the part folders")?;
    }
    let (r, published) = super::remote_out::write_to(&a.out, false, quiet, |out, _| {
        Ok(
            prep::convert::merge::merge(out, &a.parts, quiet).map_err(|e| {
                e.when_interrupted(|| "nothing was written: the same command merges again".into())
            })?,
        )
    })
    .with_context(|| format!("prep merge into {}", a.out.display()))?;
    if a.json {
        outln!("{}", super::with_upload(&r, &published)?);
    } else if !quiet {
        let splits: Vec<String> = r
            .splits
            .iter()
            .map(|(s, n)| format!("{} {s}", thousands(*n)))
            .collect();
        let how = match (r.linked, r.copied) {
            (_, 0) => "hard-linked".to_string(),
            (0, _) => "copied".to_string(),
            (l, c) => format!("{l} hard-linked, {c} copied"),
        };
        outln!(
            "merged {} parts into {}: {} samples in {} shards ({how}, {}) in {:.1} s",
            r.parts,
            a.out.display(),
            splits.join(" + "),
            r.shards,
            human(r.bytes),
            r.seconds
        );
        if r.rejects > 0 {
            eprintln!(
                "{} inputs or array samples were skipped, listed in {}",
                r.rejects,
                a.out.join(prep::convert::REJECTS).display()
            );
        }
        super::print_upload(&published)?;
    }
    Ok(ExitCode::SUCCESS)
}
