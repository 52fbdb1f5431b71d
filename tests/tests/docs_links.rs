//! Every relative link in the repository's Markdown resolves: the file (or
//! folder) it names exists, and a `#anchor` names a heading of the target
//! Markdown file (GitHub's slugs) or an explicit `<a id="…">`/`<a name="…">`
//! in it. Links to `http(s)://`, `mailto:` or any other scheme are not
//! followed, and links inside fenced code blocks or inline code are not
//! links. No stack and no DynamoDB are needed: it reads files.
//!
//! The files checked are those git tracks plus new ones it does not ignore
//! (`git ls-files --cached --others --exclude-standard`), so a page is
//! checked before its first commit, and a fresh clone checks what it holds.
//! A hand-written scanner rather than a Markdown crate: it needs headings,
//! links, fences and code spans, nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the repository root")
}

/// The Markdown files of the tree, relative to the root.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"])
        .current_dir(root)
        .output()
        .expect("git ls-files (the check lists the Markdown files git knows)");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<PathBuf> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        // A tracked file deleted in the work tree is not there to check.
        .filter(|p| root.join(p).is_file())
        .collect();
    files.sort();
    files.dedup();
    files
}

/// One link found in a file: its line and its destination as written.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    dest: String,
}

/// What a Markdown file offers to link to, and the links it makes.
#[derive(Debug, Default)]
struct Scanned {
    anchors: BTreeSet<String>,
    links: Vec<Link>,
}

/// The opening of a code fence (```` ``` ```` or `~~~`, up to three spaces
/// in): its character and length.
fn fence_of(line: &str) -> Option<(char, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = rest.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// The line with its code spans blanked out (a run of n backticks up to the
/// next run of exactly n). An unclosed run is literal text.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + n;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|c| **c == '`').count();
                if m == n {
                    closed = Some(j + m);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                out.push(' ');
                i = end;
            }
            None => {
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// Destinations of the inline links and images of a line (`[text](dest)`,
/// `![alt](dest "title")`) and of a reference definition (`[label]: dest`).
fn link_destinations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        if let Some(close) = trimmed.find("]:") {
            let dest = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
            let dest = dest.trim_start_matches('<').trim_end_matches('>');
            if !dest.is_empty() && !trimmed[..close].contains('(') {
                found.push(dest.to_string());
            }
        }
    }
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == ']' && bytes[i + 1] == '(' {
            let mut j = i + 2;
            let mut dest = String::new();
            if j < bytes.len() && bytes[j] == '<' {
                j += 1;
                while j < bytes.len() && bytes[j] != '>' {
                    dest.push(bytes[j]);
                    j += 1;
                }
            } else {
                let mut depth = 0usize;
                while j < bytes.len() && !bytes[j].is_whitespace() {
                    match bytes[j] {
                        '(' => depth += 1,
                        ')' if depth == 0 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    dest.push(bytes[j]);
                    j += 1;
                }
            }
            if !dest.is_empty() {
                found.push(dest);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    found
}

/// `id="…"` and `name="…"` of the `<a …>` tags of a line.
fn explicit_anchors(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("<a ") {
        let tag_end = rest[at..].find('>').map(|e| at + e).unwrap_or(rest.len());
        let tag = &rest[at..tag_end];
        for attr in ["id=", "name="] {
            let mut from = 0;
            while let Some(p) = tag[from..].find(attr) {
                let start = from + p + attr.len();
                // `id=` must not be the end of another attribute's name.
                let before = tag[..from + p].chars().last();
                let quote = tag[start..].chars().next();
                if matches!(before, Some(' ') | Some('\t')) && matches!(quote, Some('"') | Some('\'')) {
                    let q = quote.unwrap();
                    if let Some(len) = tag[start + 1..].find(q) {
                        found.push(tag[start + 1..start + 1 + len].to_string());
                    }
                }
                from = start;
            }
        }
        rest = &rest[tag_end..];
    }
    found
}

/// A heading's text as GitHub renders it for its slug: links become their
/// text, HTML tags and code-span backticks go.
fn heading_text(raw: &str) -> String {
    // Links: keep the bracketed text, drop `(dest)`.
    let mut text = String::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
            let mut depth = 0usize;
            let mut j = i + 2;
            while j < chars.len() {
                match chars[j] {
                    '(' => depth += 1,
                    ')' if depth == 0 => break,
                    ')' => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        text.push(chars[i]);
        i += 1;
    }
    // HTML tags.
    let mut plain = String::new();
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => plain.push(c),
            _ => {}
        }
    }
    plain
}

/// GitHub's slug of a heading's text: lowercase; letters, digits, `-`, `_`
/// and spaces kept, every other character dropped; each space a `-`.
fn slug(heading: &str) -> String {
    heading_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of an ATX heading line (`## Title ##`), if it is one.
fn atx_heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let level = rest.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let after = &rest[level..];
    if !after.is_empty() && !after.starts_with(' ') && !after.starts_with('\t') {
        return None;
    }
    let mut text = after.trim();
    // A closing sequence of `#` preceded by a space is not part of the text.
    let stripped = text.trim_end_matches('#');
    if stripped.is_empty() || stripped.ends_with(' ') {
        text = stripped.trim_end();
    }
    Some(text)
}

/// Whether a line underlines the line before it as a heading (setext).
fn setext_underline(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty()
        && line.len() - line.trim_start().len() <= 3
        && (t.chars().all(|c| c == '=') || t.chars().all(|c| c == '-'))
}

fn scan(markdown: &str) -> Scanned {
    let mut scanned = Scanned::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut add_heading = |scanned: &mut Scanned, text: &str| {
        let base = slug(text);
        let n = seen.entry(base.clone()).or_insert(0);
        let anchor = if *n == 0 { base.clone() } else { format!("{base}-{n}") };
        *n += 1;
        scanned.anchors.insert(anchor);
    };
    let mut fence: Option<(char, usize)> = None;
    // The previous line, if it could be a setext heading's text.
    let mut paragraph_line: Option<String> = None;
    for (index, line) in markdown.lines().enumerate() {
        if let Some((c, n)) = fence {
            if let Some((c2, n2)) = fence_of(line) {
                if c2 == c && n2 >= n && line.trim().chars().all(|x| x == c) {
                    fence = None;
                }
            }
            continue;
        }
        if let Some(open) = fence_of(line) {
            fence = Some(open);
            paragraph_line = None;
            continue;
        }
        let text = without_code_spans(line);
        if let Some(previous) = paragraph_line.take() {
            if setext_underline(line) {
                add_heading(&mut scanned, &previous);
                continue;
            }
        }
        for anchor in explicit_anchors(&text) {
            scanned.anchors.insert(anchor);
        }
        for dest in link_destinations(&text) {
            scanned.links.push(Link { line: index + 1, dest });
        }
        if let Some(heading) = atx_heading(line) {
            add_heading(&mut scanned, heading);
            continue;
        }
        let t = line.trim();
        let plain_text = !t.is_empty()
            && !t.starts_with('|')
            && !t.starts_with('>')
            && !t.starts_with('-')
            && !t.starts_with('*')
            && !t.starts_with('<')
            && line.len() - line.trim_start().len() <= 3;
        paragraph_line = plain_text.then(|| line.to_string());
    }
    scanned
}

/// A link leaves the repository (`https:`, `mailto:`, any scheme).
fn is_external(dest: &str) -> bool {
    let Some(colon) = dest.find(':') else { return false };
    let scheme = &dest[..colon];
    !scheme.is_empty()
        && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a/b/../c` → `a/c`, without touching the file system; `None` if it
/// climbs out of the repository.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// Every broken link of the tree, as `file:line: link: why`.
fn broken_links(root: &Path) -> Vec<String> {
    let files = markdown_files(root);
    let mut scans: BTreeMap<PathBuf, Scanned> = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        scans.insert(file.clone(), scan(&text));
    }
    let mut anchors_of_other: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for (file, scanned) in &scans {
        for link in &scanned.links {
            if is_external(&link.dest) {
                continue;
            }
            let (path_part, fragment) = match link.dest.split_once('#') {
                Some((p, f)) => (p, Some(percent_decoded(f))),
                None => (link.dest.as_str(), None),
            };
            let path_part = percent_decoded(path_part.split('?').next().unwrap_or(""));
            let target = if path_part.is_empty() {
                Some(file.clone())
            } else if let Some(from_root) = path_part.strip_prefix('/') {
                normalized(Path::new(from_root))
            } else {
                normalized(&file.parent().unwrap_or(Path::new("")).join(&path_part))
            };
            let where_ = format!("{}:{}: ({})", file.display(), link.line, link.dest);
            let Some(target) = target else {
                broken.push(format!("{where_}: leaves the repository"));
                continue;
            };
            let on_disk = root.join(&target);
            if !on_disk.exists() {
                broken.push(format!("{where_}: no file {}", target.display()));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            // Anchors are checked in Markdown targets only (a code file's
            // `#L10` is GitHub's viewer, not the file).
            if target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let anchors = match scans.get(&target) {
                Some(s) => &s.anchors,
                None => anchors_of_other
                    .entry(target.clone())
                    .or_insert_with(|| scan(&std::fs::read_to_string(&on_disk).unwrap_or_default()).anchors),
            };
            if !anchors.contains(&fragment) {
                broken.push(format!("{where_}: {} has no heading or anchor #{fragment}", target.display()));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_markdown_resolves() {
    let root = repo_root();
    let files = markdown_files(&root);
    assert!(files.iter().any(|f| f == Path::new("README.md")), "README.md is among the files checked: {files:?}");
    let broken = broken_links(&root);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the Markdown ({} files checked):\n{}",
        broken.len(),
        files.len(),
        broken.join("\n")
    );
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("Quick start"), "quick-start");
    assert_eq!(slug("How fast does an order close?"), "how-fast-does-an-order-close");
    assert_eq!(
        slug("Pieces, retries and the merged report (why SQS, not Step Functions)"),
        "pieces-retries-and-the-merged-report-why-sqs-not-step-functions"
    );
    assert_eq!(slug("`OrderExpiringSoon`: the heads-up before expiry"), "orderexpiringsoon-the-heads-up-before-expiry");
    assert_eq!(slug("The due index (GSI `due-index`): open orders"), "the-due-index-gsi-due-index-open-orders");
    assert_eq!(slug("Webhook: `POST /payments/stripe/notify`"), "webhook-post-paymentsstripenotify");
    assert_eq!(slug("A — B"), "a--b");
    assert_eq!(slug("snake_case stays"), "snake_case-stays");
    assert_eq!(slug("See [the docs](docs/x.md) here"), "see-the-docs-here");
    assert_eq!(
        slug("What ministack does differently (measured with ministack 1.5.33)"),
        "what-ministack-does-differently-measured-with-ministack-1533"
    );
}

#[test]
fn the_scanner_finds_headings_anchors_and_links_outside_code() {
    let text = "# Title\n\n## Twice\n\n## Twice\n\nSetext\n------\n\n<a id=\"close-protocol\"></a>\n\
        See [a](other.md#x), ![i](img.png \"t\") and `[not](a-link.md)`.\n\n\
        ```bash\n[not](in-a-fence.md)\n# not a heading\n```\n\n[ref]: docs/ref.md\n";
    let scanned = scan(text);
    let anchors: Vec<&str> = scanned.anchors.iter().map(String::as_str).collect();
    assert_eq!(anchors, ["close-protocol", "setext", "title", "twice", "twice-1"]);
    let dests: Vec<&str> = scanned.links.iter().map(|l| l.dest.as_str()).collect();
    assert_eq!(dests, ["other.md#x", "img.png", "docs/ref.md"]);
    assert!(is_external("https://example.com") && is_external("mailto:a@b.c") && !is_external("docs/a.md#b"));
}
