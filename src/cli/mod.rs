//! The `run` command, for CI pipelines: [`files`] turns arguments (files, directories,
//! globs) into the files to run, [`run`] runs them through the application core (`--jobs`
//! at once, `--fail-fast`), [`output`] prints (live, or a block per file; the summary),
//! [`junit`] and [`github`] write the reports CI systems show.

pub mod files;
pub mod github;
pub mod junit;
pub mod output;
pub mod run;
