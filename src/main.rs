//! The `ipoib-cm` command.

fn main() {
    println!("ipoib-cm");
}
