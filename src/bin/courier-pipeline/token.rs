//! `courier-pipeline token ...`: mints one token with its audience's private key and prints it.

use clap::Subcommand;
use courier_auth::Audience;
use std::time::Duration;

/// The tokens the binary mints, one subcommand per audience.
#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// A support actor's trail token (audience `trail`, signed with trail.key), on stdout.
    #[command(alias = "support")]
    Trail {
        /// Who will use it; recorded in trail_access_log.
        #[arg(long)]
        actor: String,
        /// How long it is valid, e.g. `1h`, `30m`.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A data-protection officer's erasure token (audience `privacy`, signed with
    /// privacy.key), on stdout: `POST /couriers/{id}/erasure` (docs/privacy.md).
    Privacy {
        /// Who will use it; recorded in erasure_log.
        #[arg(long)]
        actor: String,
        /// How long it is valid, e.g. `15m`.
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// An operations user's token for the live map `/ops` (audience `ops`, signed with
    /// ops.key), on stdout; the trail API admits it too (docs/maps.md).
    Ops {
        /// Who will use it; recorded in trail_access_log as `ops:<user>`.
        #[arg(long, alias = "actor")]
        user: String,
        /// How long it is valid, e.g. `8h` (a shift).
        #[arg(long, default_value = "8h", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A courier's device token (MQTT password at the edge; username = the courier id), signed
    /// with courier.key. Rotation: docs/security.md.
    Courier {
        /// The courier id, e.g. c00042.
        #[arg(long)]
        id: String,
        /// How long it is valid.
        #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// A worker's bus token (audience `bus`, signed with bus.key; username = the role), for a
    /// process given MQTT_TOKEN instead of bus.key, such as the edge.
    #[command(alias = "service")]
    Bus {
        /// The role it is for, e.g. ingest.
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
}

impl TokenCommand {
    /// The audience minted: its private key is the only one the command reads.
    pub(crate) fn audience(&self) -> Audience {
        match self {
            TokenCommand::Courier { .. } => Audience::Courier,
            TokenCommand::Trail { .. } => Audience::Trail,
            TokenCommand::Privacy { .. } => Audience::Privacy,
            TokenCommand::Ops { .. } => Audience::Ops,
            TokenCommand::Bus { .. } => Audience::Bus,
        }
    }

    /// Prints the token (the name it is for checked first).
    pub(crate) fn run(self, config: &courier_pipeline::Config) -> anyhow::Result<()> {
        let aud = self.audience();
        let claims: Box<dyn FnOnce(u64) -> courier_auth::Claims> = match self {
            TokenCommand::Trail { actor, ttl } => {
                check_actor(&actor)?;
                Box::new(move |now| courier_auth::Claims::trail(actor.trim(), now, ttl.as_secs()))
            }
            TokenCommand::Privacy { actor, ttl } => {
                check_actor(&actor)?;
                Box::new(move |now| courier_auth::Claims::privacy(actor.trim(), now, ttl.as_secs()))
            }
            TokenCommand::Ops { user, ttl } => {
                check_actor(&user)?;
                Box::new(move |now| courier_auth::Claims::ops(user.trim(), now, ttl.as_secs()))
            }
            TokenCommand::Courier { id, ttl } => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&id),
                    "--id: not a valid courier id"
                );
                Box::new(move |now| courier_auth::Claims::courier(&id, now, ttl.as_secs()))
            }
            TokenCommand::Bus { role, ttl } => {
                anyhow::ensure!(
                    courier_wire::topic::valid_id(&role),
                    "--role: letters, digits, - and _ only"
                );
                Box::new(move |now| courier_auth::Claims::bus(&role, now, ttl.as_secs()))
            }
        };
        mint(config, aud, claims)
    }
}

/// An actor named in an audit row: printable, 1-128 characters.
fn check_actor(actor: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !actor.trim().is_empty() && actor.len() <= 128 && !actor.chars().any(char::is_control),
        "--actor must be a name of 1-128 printable characters"
    );
    Ok(())
}

/// Prints a token signed with the audience's private key.
fn mint(
    config: &courier_pipeline::Config,
    aud: Audience,
    claims: impl FnOnce(u64) -> courier_auth::Claims,
) -> anyhow::Result<()> {
    let key = config.signer(aud, &format!("{aud} tokens are signed with it"))?;
    let now = courier_wire::clock::unix_now() as u64;
    println!("{}", key.sign(&claims(now)));
    Ok(())
}
