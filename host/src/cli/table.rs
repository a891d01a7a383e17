//! Plain-text tables for the CLI: each column as wide as its widest cell,
//! numbers aligned right, two spaces between columns, no trailing blanks.

/// A column's heading and alignment.
pub(crate) struct Column {
    heading: &'static str,
    right: bool,
}

/// A left-aligned column.
pub(crate) fn text(heading: &'static str) -> Column {
    Column { heading, right: false }
}

/// A right-aligned column (figures).
pub(crate) fn figure(heading: &'static str) -> Column {
    Column { heading, right: true }
}

/// Rows under headings.
pub(crate) struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(columns: Vec<Column>) -> Table {
        Table { columns, rows: Vec::new() }
    }

    /// Adds a row; missing cells are blank, extra ones are dropped.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_owned();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                let heading = self.columns[i].heading.chars().count();
                self.rows.iter().map(|r| cell(r, i).chars().count()).fold(heading, usize::max)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let mut out = String::new();
            for (i, (text, column)) in cells.iter().zip(&self.columns).enumerate() {
                if i > 0 {
                    out.push_str("  ");
                }
                let pad = widths[i].saturating_sub(text.chars().count());
                if column.right {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(text);
                } else {
                    out.push_str(text);
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.trim_end().to_owned()
        };
        let mut lines = vec![line(self.columns.iter().map(|c| c.heading.to_owned()).collect())];
        lines.extend(self.rows.iter().map(|r| line((0..self.columns.len()).map(|i| cell(r, i)).collect())));
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell() {
        let mut table = Table::new(vec![text("JOB"), figure("IN"), text("STATE")]);
        table.row(vec!["counts".into(), "12.3k".into(), "running".into()]);
        table.row(vec!["a".into(), "7".into()]);
        assert_eq!(table.render(), "JOB        IN  STATE\ncounts  12.3k  running\na           7");
    }
}
