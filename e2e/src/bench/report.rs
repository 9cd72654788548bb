//! A bench's figures as markdown.

use std::fmt::Write as _;

use super::{Figures, Percentiles};

use super::search::NOT_THE_SYSTEM;

fn pcts(p: &Percentiles) -> String {
    format!("{:.0} / {:.0} / {:.0}", p.p50_ms, p.p99_ms, p.p999_ms)
}

/// The figures as a markdown report.
pub fn markdown(f: &Figures) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Saga capacity — {}\n\n{}\n", f.date, f.machine);
    let topics = kafka::client::TopicSettings {
        replication_factor: crate::stack::replication_factor(f.kafka_nodes as usize),
        ..Default::default()
    };
    let _ = writeln!(
        s,
        "- Kafka: {} node(s), {} partitions per topic, replication factor {} (min ISR {})",
        f.kafka_nodes,
        f.partitions,
        topics.replication_factor,
        topics.min_insync_replicas()
    );
    let _ = writeln!(s, "- orders: {}", f.mix.describe());
    let _ = writeln!(s, "- PostgreSQL: {}", f.postgres.version);
    let _ = writeln!(
        s,
        "- reached over: {} (TLS: {})",
        f.postgres.transport,
        if f.postgres.tls { "yes" } else { "no" }
    );
    let _ = writeln!(
        s,
        "- its settings not at their defaults: `{}`",
        f.postgres.settings.join("`, `")
    );
    if !f.postgres_settings.is_empty() {
        let _ = writeln!(s, "- set for this run: `{}`", f.postgres_settings.join("`, `"));
    }
    let _ = writeln!(s, "\n| figure | value |\n|---|---:|");
    let failed = if f.failed_rate.is_finite() {
        format!(
            "{:.0} not; the capacity lies in [{:.0}, {:.0}): {:.0} ± {:.1} %",
            f.failed_rate,
            f.sustained_rate,
            f.failed_rate,
            (f.sustained_rate + f.failed_rate) / 2.0,
            (f.failed_rate - f.sustained_rate) / (f.sustained_rate + f.failed_rate) * 100.0
        )
    } else {
        "no failing rate found".into()
    };
    let _ = writeln!(
        s,
        "| **sustained, orders/s** | **{:.0}** ({failed}) |",
        f.sustained_rate
    );
    if let Some(t) = f.sustained_trial() {
        let _ = writeln!(
            s,
            "| placed → terminal at {:.0}/s, p50 / p99 / p99.9 ms | {} |",
            t.rate,
            pcts(&t.latency)
        );
    }
    if let Some(l) = &f.latency {
        let _ = writeln!(
            s,
            "| placed → terminal at {:.0}/s (half), p50 / p99 / p99.9 ms | {} |",
            l.rate,
            pcts(&l.placed_to_terminal)
        );
        for stage in &l.stages {
            let _ = writeln!(
                s,
                "| … {}: p50 / p99 ms | {:.0} / {:.0} |",
                stage.name, stage.p50_ms, stage.p99_ms
            );
        }
    }
    if let Some(b) = &f.burst {
        let _ = writeln!(
            s,
            "| burst {:.0}/s × {} orders: drain orders/s (peak backlog), p50 / p99 / p99.9 ms, failed, latest send | {:.0} ({}), {}, {}, {:.1} s |",
            b.rate,
            b.placed,
            b.drain_per_sec,
            b.peak_backlog,
            pcts(&b.latency),
            b.failed,
            b.send_lag_secs
        );
    }
    if let Some(t) = f.sustained_trial() {
        let all: f64 = t.cpu_ms_per_order.values().sum();
        let system: f64 = t
            .cpu_ms_per_order
            .iter()
            .filter(|(p, _)| !NOT_THE_SYSTEM.contains(&p.as_str()))
            .map(|(_, ms)| ms)
            .sum();
        let _ = writeln!(
            s,
            "| CPU per order at {:.0}/s: every process / without the driver and the mock gateway, ms | {all:.2} / {system:.2} |",
            t.rate
        );
        let _ = writeln!(
            s,
            "| … as a multiple of the floor of one order | {:.1}× / {:.1}× |",
            all / f.floor.order_ms,
            system / f.floor.order_ms
        );
        let _ = writeln!(
            s,
            "| **the system's own CPU per order**: four services, Kafka, PostgreSQL for the system's databases only, ms | **{:.2}** |",
            t.own_cpu_ms_per_order
        );
        for (label, ms) in &t.postgres_cpu_ms_per_order {
            let _ = writeln!(s, "| … {label}, ms | {ms:.2} |");
        }
        let purged: Vec<String> = t.purged_rows.iter().map(|(s, n)| format!("{s} {n:.0}")).collect();
        let _ = writeln!(
            s,
            "| rows the retention purges deleted in that trial | {} |",
            purged.join(", ")
        );
    }
    let fl = &f.floor;
    let _ = writeln!(
        s,
        "| floor of one order: 1 commit + 4 messages + 2 HTTP calls, CPU ms | {:.3} + 4 × {:.3} + 2 × {:.3} = **{:.2}** ({:.0} orders/s on {} cores) |",
        fl.commit_ms,
        fl.message_ms,
        fl.http_call_ms,
        fl.order_ms,
        fl.orders_per_sec,
        super::cores()
    );
    let _ = writeln!(
        s,
        "| broker alone, warm: messages/s (produce + consume, {} B), as orders/s | {:.0}, {:.0} |",
        f.broker.message_bytes, f.broker.messages_per_sec, f.broker.orders_per_sec
    );
    let db = &f.database;
    let _ = writeln!(
        s,
        "| database alone: bare commits/s; create tx/s (CPU ms); consumer commands/s one per tx, in batches of {}; as orders/s | {:.0}; {:.0} ({:.2}); {:.0}, {:.0}; {:.0} |",
        super::ceilings::CONSUMER_BATCH,
        db.bare_commit_per_sec,
        db.create_tx_per_sec,
        db.create_cpu_ms,
        db.consumer_tx_per_sec,
        db.consumer_batched_per_sec,
        db.orders_per_sec
    );
    let i = &f.intake;
    let _ = writeln!(
        s,
        "| intake alone (relay stopped, {} clients): req/s, p50 / p99 ms, CPU ms per order | {:.0}, {:.1} / {:.1}, {:.2} |",
        i.http.clients, i.http.requests_per_sec, i.http.p50_ms, i.http.p99_ms, i.cpu_ms_per_order
    );
    verdicts(&mut s, f);
    trials(&mut s, f);
    prefilled(&mut s, f);
    instances(&mut s, f);
    cpu(&mut s, f);
    statements(&mut s, f);
    s
}

fn statements(s: &mut String, f: &Figures) {
    let Some(t) = f.sustained_trial() else {
        return;
    };
    if t.pg_statements.is_empty() {
        let _ = writeln!(
            s,
            "\nPostgreSQL's statements not profiled: preload `pg_stat_statements` (shared_preload_libraries, a restart) to see where its time goes."
        );
        return;
    }
    let _ = writeln!(
        s,
        "\n## Where PostgreSQL's time went at {:.0} orders/s (pg_stat_statements, execution time)\n",
        t.rate
    );
    let _ = writeln!(
        s,
        "| share | ms / order | calls / order | WAL B / order | database | statement |\n|---:|---:|---:|---:|---|---|"
    );
    for st in &t.pg_statements {
        let _ = writeln!(
            s,
            "| {:.1} % | {:.3} | {:.2} | {:.0} | {} | `{}` |",
            st.share * 100.0,
            st.ms_per_order,
            st.calls_per_order,
            st.wal_bytes_per_order,
            st.database,
            st.query.replace('|', "\\|").replace('`', "'")
        );
    }
}

fn verdicts(s: &mut String, f: &Figures) {
    let _ = writeln!(
        s,
        "\n## Each rate's verdict\n\nA rate holds when most of its trials did; medians with [lowest, highest].\n"
    );
    let _ = writeln!(
        s,
        "| rate | trials (sustained) | holds | completed /s | offered /s | p99 ms | CPU ms / order | own CPU ms / order |\n|---:|---:|---|---|---|---|---|---|"
    );
    let sp = |x: &super::search::Spread, d: usize| format!("{:.d$} [{:.d$}, {:.d$}]", x.median, x.min, x.max);
    for v in &f.verdicts {
        let _ = writeln!(
            s,
            "| {:.0} | {} ({}) | {} | {} | {} | {} | {} | {} |",
            v.rate,
            v.trials,
            v.sustained,
            if v.holds { "yes" } else { "no" },
            sp(&v.completed_per_sec, 0),
            sp(&v.offered_per_sec, 0),
            sp(&v.p99_ms, 0),
            sp(&v.cpu_ms_per_order, 2),
            sp(&v.own_cpu_ms_per_order, 2)
        );
    }
}

fn trials(s: &mut String, f: &Figures) {
    let _ = writeln!(s, "\n## Trials, in order\n");
    let _ = writeln!(
        s,
        "| rate | placed | offered /s (latest send late, s) | completed /s | failed | cancels (refused) | backlog mid → end (growth) | p50 / p99 / p99.9 ms | sustained | drain s | WAL kB / order | commits / order |\n|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|"
    );
    for t in &f.trials {
        let _ = writeln!(
            s,
            "| {:.0} | {} | {:.0} ({:.1}) | {:.0} | {} | {} ({}) | {} → {} ({:+.0}) | {} | {} | {} | {:.1} | {:.1} |",
            t.rate,
            t.placed,
            t.offered_per_sec,
            t.send_lag_secs,
            t.completed_per_sec,
            t.failed,
            t.cancels,
            t.cancels_failed,
            t.backlog_mid,
            t.backlog_end,
            t.backlog_growth,
            pcts(&t.latency),
            if t.sustained { "yes" } else { "no" },
            t.drain_secs.map_or("—".into(), |d| format!("{d:.1}")),
            t.postgres_per_order.wal_bytes / 1024.0,
            t.postgres_per_order.commits
        );
    }
    let _ = writeln!(
        s,
        "\nThe queues behind each trial — peak (growth over the window; seconds to empty after the orders drained, ✗: not within {} s):\n",
        super::queues::DRAIN_LIMIT.as_secs()
    );
    for t in &f.trials {
        let queues: Vec<String> = t
            .queues
            .queues
            .iter()
            .map(|q| {
                format!(
                    "{} {} ({:+.0}; {})",
                    q.name,
                    q.peak,
                    q.growth,
                    q.drained_secs.map_or("✗".into(), |d| format!("{d:.0} s"))
                )
            })
            .collect();
        let behind = if t.queues_behind.is_empty() {
            "all kept up".to_owned()
        } else {
            format!("**behind: {}**", t.queues_behind.join(", "))
        };
        let _ = writeln!(s, "- {:.0}/s: {behind} — {}", t.rate, queues.join(" · "));
    }
}

fn prefilled(s: &mut String, f: &Figures) {
    if f.prefilled.is_empty() {
        let _ = writeln!(s, "\nTables not prefilled: they held only this run's orders.");
        return;
    }
    let _ = writeln!(
        s,
        "\n## Tables prefilled\n\nAgeing rows pass their retention during the run (the purges delete them); the body stays.\n"
    );
    let _ = writeln!(
        s,
        "| table | retention | ageing rows | body rows | steady state at {:.0}/s |\n|---|---:|---:|---:|---:|",
        f.sustained_rate
    );
    for t in &f.prefilled {
        let _ = writeln!(
            s,
            "| {} | {} d | {} | {} | {:.0} |",
            t.table,
            t.retention_secs / 86_400,
            t.ageing_rows,
            t.body_rows,
            t.steady_state_rows(f.sustained_rate)
        );
    }
}

fn instances(s: &mut String, f: &Figures) {
    let _ = writeln!(
        s,
        "\n## Consumer instances ({} per service): events applied over the run\n",
        f.instances_per_service
    );
    let _ = writeln!(
        s,
        "| service | instance | partitions | applied | duplicates absorbed |\n|---|---|---:|---:|---:|"
    );
    for i in &f.instances {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} |",
            i.service,
            i.url,
            i.partitions,
            i.applied.max(0.0),
            i.duplicates.max(0.0)
        );
    }
}

fn cpu(s: &mut String, f: &Figures) {
    let Some(best) = f.sustained_trial() else {
        return;
    };
    let _ = writeln!(s, "\n## CPU per order at {:.0} orders/s (ms)\n", best.rate);
    let _ = writeln!(
        s,
        "Idle: cores the process uses with no orders. Above idle: ms per order beyond that fixed cost.\n"
    );
    let _ = writeln!(
        s,
        "| process | ms / order | idle, cores | above idle, ms / order |\n|---|---:|---:|---:|"
    );
    let above = |p: &str, ms: f64| ms - f.idle_cores.get(p).unwrap_or(&0.0) * 1000.0 / best.rate;
    for (p, ms) in &best.cpu_ms_per_order {
        let idle = f.idle_cores.get(p).unwrap_or(&0.0);
        let _ = writeln!(s, "| {p} | {ms:.2} | {idle:.3} | {:.2} |", above(p, *ms));
    }
    let total: f64 = best.cpu_ms_per_order.values().sum();
    let idle: f64 = f.idle_cores.values().sum();
    let _ = writeln!(
        s,
        "| **total** | **{total:.2}** | **{idle:.3}** | **{:.2}** |",
        total - idle * 1000.0 / best.rate
    );
}
