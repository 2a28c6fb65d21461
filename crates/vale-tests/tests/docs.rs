//! The documentation's links: every relative link of README.md and of the pages under `docs/`
//! names a file of the repository, and a link with a `#fragment` into a Markdown page names
//! one of its headings (as GitHub makes anchors of them).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages checked: README.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    pages
}

/// The lines of a page outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter(move |(_, l)| {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The targets of the inline links `[text](target)` of a line.
fn links(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].split_whitespace().next().unwrap_or(""));
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// made hyphens; a repeated anchor gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, l) in prose(text) {
        let Some(title) = l.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut name = slug.clone();
        let mut n = 0;
        while seen.contains(&name) {
            n += 1;
            name = format!("{slug}-{n}");
        }
        seen.insert(name);
    }
    seen
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text) {
            for target in links(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let at = format!("{}:{}: {target}", page.display(), n + 1);
                if !file.exists() {
                    bad.push(format!("{at}: no such file"));
                    continue;
                }
                if let Some(f) = fragment {
                    if file.extension().is_some_and(|x| x == "md") {
                        let text = fs::read_to_string(&file).unwrap();
                        if !anchors(&text).contains(f) {
                            bad.push(format!("{at}: no heading makes anchor '#{f}'"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn the_anchor_of_a_heading_is_githubs() {
    let a = anchors("# Watching a switch\n## `valed --metrics`: scrapes\n## Watching a switch\n");
    assert!(a.contains("watching-a-switch"));
    assert!(a.contains("valed---metrics-scrapes"));
    assert!(a.contains("watching-a-switch-1"));
    assert_eq!(
        links("see [a](b.md) and [c](d.md#e \"t\")"),
        vec!["b.md", "d.md#e"]
    );
}
