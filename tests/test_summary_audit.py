"""The simulator's own checks of summaries (compactstore._summary_audit): they must catch
what they measure, or the figures they give mean nothing."""

from __future__ import annotations

from compactstore import _summary_audit as audit

SUMMARY = """[Context compacted]

## Later instructions from the user (oldest first)
- 3 earlier instructions (seqs 4–20): use recall
- (seq 31) <command-name>/compact</command-name>
- (seq 40) Fix the flaky test

## Files (newest first)
- src/app.py — modified
- /home/me/proj/src/app.py — read
- _build/src/app.py — read

## Errors
- Bash (seq 12): Exit code 1\\nTraceback"""


def test_noise_lines_are_found_by_their_markers() -> None:
    assert audit.noise_lines(SUMMARY) == ["- (seq 31) <command-name>/compact</command-name>"]


def test_a_file_listed_twice_is_counted_whatever_its_spelling() -> None:
    files = audit.listed_files(SUMMARY)
    assert files == ["src/app.py", "/home/me/proj/src/app.py", "_build/src/app.py"]
    assert audit.duplicate_files(files) == 1, "two relative paths are two files"


def test_escapes_recall_spans_and_presence() -> None:
    assert audit.escaped_newlines(SUMMARY)
    assert audit.recall_spans(SUMMARY) == [(4, 20)]
    hay = audit.squash(SUMMARY)
    assert audit.present("Fix the   flaky\ntest", hay)
    assert not audit.present("Fix the other test", hay)


def test_claude_codes_summary_lists_quoted_user_messages() -> None:
    reference = (
        '6. All user messages:\n   - "Implement it"\n   - (interrupted)\n'
        '   - "check again" (asking to re-check)\n\n7. Pending Tasks:\n   - "not this"'
    )
    assert audit.quoted_user_messages(reference) == ["Implement it", "check again"]


def test_pending_plan_items_are_those_not_completed() -> None:
    plan = '{"plan": [{"step": "a", "status": "completed"}, {"step": "b", "status": "pending"}]}'
    assert audit.pending_plan_items("update_plan", plan) == ["b"]
    todos = {"todos": [{"content": "c", "status": "in_progress"}]}
    assert audit.pending_plan_items("TodoWrite", todos) == ["c"]
    assert audit.pending_plan_items("Read", {"file_path": "x"}) is None


def test_windows_spellings_of_one_file_are_counted_as_doubles() -> None:
    files = ["website/a.js", "D:\\w\\website\\a.js", "d:/w/website/B.js", "website/b.js", "x/a.js"]
    assert audit.duplicate_files(files) == 2


def test_with_the_cwd_a_relative_path_is_the_file_under_it() -> None:
    """A relative path and an absolute path elsewhere that ends the same way are two files
    once the working directory is known; the same file under it is still one."""
    files = ["/Users/c/src/app-action/README.md", "README.md"]
    assert audit.duplicate_files(files) == 1, "without the cwd: the suffix rule"
    assert audit.duplicate_files(files, "/Users/c/src/app") == 0
    assert (
        audit.duplicate_files(["/Users/c/src/app/README.md", "README.md"], "/Users/c/src/app") == 1
    )
    windows = ["C:/Users/j/bin/omp.exe", "bin/omp.exe", "D:\\w\\bin\\omp.exe"]
    assert audit.duplicate_files(windows, "D:\\w") == 1


def test_a_windows_path_is_no_escaped_newline() -> None:
    assert not audit.escaped_newlines("- Bash (seq 7): at D:\\w\\website\\node_modules\\x.js")
    assert audit.escaped_newlines("- Bash (seq 7): at D:\\w\\x.js: Exit code 1\\nTraceback")
