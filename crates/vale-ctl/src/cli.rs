//! The command line: what vale-ctl takes, with its help text (the man pages are made from it).

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use vale_abi::control::ModuleArg;
use vale_abi::name::{parse_port, parse_switch};

use crate::capture;

/// Why a value on the command line is refused: clap prints it after "invalid value 'V' for
/// 'ARG'", vale-ctl's own checks (the vlan flags) as a usage error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ValueError {
    /// A malformed switch or port name, in `vale_abi::name`'s words.
    #[error("{0}")]
    Name(String),
    #[error("expected KEY=VALUE, not '{0}'")]
    KeyValue(String),
    #[error("expected seconds from 0.1 to 3600, not '{0}'")]
    Seconds(String),
    /// `--access`/`--trunk` (the flag) without `PORT=VLANS`.
    #[error("--{flag} takes PORT=VLANS, not '{value}'")]
    VlanPort { flag: &'static str, value: String },
    /// `--access`/`--trunk` naming a port of another switch.
    #[error("--{flag} {value}: port '{port}' is not on switch '{switch}'")]
    OtherSwitch {
        flag: &'static str,
        value: String,
        port: String,
        switch: String,
    },
}

impl ValueError {
    fn name(e: impl std::fmt::Display) -> ValueError {
        ValueError::Name(e.to_string())
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "vale-ctl",
    version,
    about = "Control vale switches and ports: list them with counters, create and destroy \
persistent ports, attach TAP devices and network interfaces, set knobs",
    long_about = "vale-ctl controls vale, a virtual local Ethernet in user space. It talks to \
valed, the vale daemon, through the control socket <run dir>/valed.sock: it lists switches \
(valeX) and ports (valeX:Y) with their counters, creates persistent ports, destroys ports and \
whole switches, attaches TAP devices (the host stack, containers) and network interfaces \
(NICs, veths) as ports, and sets switch and port knobs.\n\n\
Switch and port names are valeX and valeX:Y, where X and Y are 1 to 32 letters, digits, '_' \
or '-'.\n\n\
vale-ctl never starts valed: when no valed serves the run directory it says so and exits with \
status 3. Start valed by hand, or let a libvale client (such as vale-pktgen) start it.",
    after_help = "KNOBS (vale-ctl set TARGET KNOB VALUE):\n  \
valeX    batch N          frames gathered from a ring per pass, 1-2048 (default 512)\n  \
valeX    lookup MODULE    learning (default), hub, vlan, flow; see 'vale-ctl lookup --help'\n  \
valeX:Y  moderation US    microseconds between interrupts toward the client, 0 = immediate\n  \
valeX:Y  learn-limit N    most source MACs the learning bridge keeps for the port (default 1024)\n\n\
Switch knobs and learn-limit need an administrator (root, valed's user or valed\n\
--admin-group); moderation needs the port's owner or an administrator.\n\n\
EXAMPLES:\n  \
vale-ctl create vale0:a              persistent port a on switch vale0 (made if absent)\n  \
vale-ctl list                        every switch and port, with counters\n  \
vale-ctl ls vale0:a --json           one port, as JSON\n  \
vale-ctl set vale0 batch 64\n  \
vale-ctl set vale0 lookup hub\n  \
vale-ctl lookup vale0                the lookup module, its configuration and counters\n  \
vale-ctl lookup vale0 vlan --access vale0:a=10 --trunk vale0:up=10,20\n  \
vale-ctl lookup vale0 ./libmine.so --arg k=v   a module built outside vale\n  \
vale-ctl lookup vale0 flow --rules rules.txt    an ordered match/action table\n  \
vale-ctl flow vale0 add 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop'\n  \
vale-ctl flow vale0 dump             the rules with their hit counters\n  \
vale-ctl module vale0 dump           a command of the switch's lookup module, its answer as is\n  \
vale-ctl set vale0:a moderation 20\n  \
vale-ctl set vale0:a learn-limit 16  a port with at most 16 stations behind it\n  \
vale-ctl attach vale0:h1 --tap vtap1 valed creates TAP vtap1; its frames join vale0\n  \
vale-ctl attach vale0:eth --iface veth0      veth0's frames join vale0 (AF_XDP)\n  \
vale-ctl attach vale0:vm1 --vhost-user /run/vale/vm1.sock   a VM's virtio-net (QEMU)\n  \
vale-ctl attach vale0:cnf --memif /run/vale/cnf.sock   a DPDK/VPP memif client\n  \
vale-ctl detach vale0:eth            veth0 goes back to the kernel\n  \
vale-ctl destroy vale0:a             remove one port (taken from its client, if held)\n  \
vale-ctl rm vale0                    remove switch vale0 and all its ports\n  \
vale-ctl top                         live per-port rates and drops, like top (q to quit)\n  \
vale-ctl capture vale0:a -w a.pcapng -c 1000   the port's frames, both ways, for Wireshark\n  \
vale-ctl capture vale0:a --dir rx -w - | tcpdump -nr -   live into tcpdump\n  \
vale-ctl --run-dir /tmp/v list       ask the valed of another run directory\n\n\
EXIT STATUS:\n  \
0  success\n  \
1  valed refused the request (its message is printed), the name given to list does not\n     \
exist, or the conversation with valed failed\n  \
2  usage error: unknown command or option, missing argument, malformed name\n  \
3  no valed running for the run directory\n\n\
ENVIRONMENT:\n  \
VALE_RUN_DIR   run directory when --run-dir is not given (default /run/vale)\n\n\
FILES:\n  \
<run dir>/valed.sock   valed's control socket; its permissions say who may use vale-ctl"
)]
pub(crate) struct Cli {
    /// Run directory of the valed to talk to [env: VALE_RUN_DIR] [default: /run/vale]
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) run_dir: Option<PathBuf>,
    /// Print JSON on stdout instead of text (list: the switches; other commands: {"ok":true})
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Capture a port's frames, as pcapng or pcap, to a file or a pipe
    #[command(
        long_about = "Captures the frames of port valeX:Y, of any kind (native, or a host \
port's), and writes them as pcapng (the default) or classic pcap to FILE, or to \
standard output with -w - or no -w, for tcpdump -r, tshark -r, Wireshark, or live into \
'tcpdump -nr -' and 'wireshark -k -i -'.\n\n\
Directions are the port's, as on a network interface: tx is what the port sends into the \
switch (its client's, device's or guest's frames), rx what the switch delivers to it. \
pcapng names the port in its interface block (if_name valeX:Y) and marks each frame \
outbound (tx) or inbound (rx) in its epb_flags, so 'tshark -T fields -e frame.packet_flags_direction' \
or Wireshark's frame details tell them apart; classic pcap has no place for either. An rx \
frame is captured as the switch hands it to the port, with its VLAN tag as the port gets \
it; one the port then drops (its ring full) is in the capture and in the port's RX-DROP. \
Frames carrying offload work (TSO, partial checksum, between ports that offload) are \
captured as they cross the switch: one large frame, checksum not filled in.\n\n\
valed copies each captured frame (up to --snaplen bytes) into a buffer of --buffer MiB \
that it shares with vale-ctl. When vale-ctl cannot keep up, or stops reading (a stopped \
pipe), valed counts the frames that did not fit as capture drops and goes on: the port \
loses no frame and forwarding pays only the copy. The drops are printed at the end and, in \
pcapng, written to an interface statistics block (isb_ifdrop).\n\n\
The capture ends after --count frames, after --duration seconds, at Ctrl-C (SIGINT, \
SIGTERM, SIGHUP), when the reader of a pipe goes away, when the port goes away (destroyed, \
detached and not persistent, its client gone), or when valed stops; the output is always \
complete. It prints how many frames it captured and dropped on standard error.\n\n\
Capturing a port reads its traffic: only the port's owner (the uid in 'vale-ctl list') or \
an administrator may, as only they may tune it. A user that is not an administrator gets at \
most 64 MiB of buffer, and the buffer counts in its port memory (valed \
--max-port-memory-per-user) until the capture ends; a port has at most 8 captures at once.\n\n\
EXPRESSION, in tcpdump's language (pcap-filter(7): 'icmp', 'tcp port 22', 'not arp', \
'ether host 02:00:00:00:00:01'), picks the frames captured: vale-ctl compiles it with \
libpcap's pcap_compile (libpcap is loaded only then) into a classic BPF program, which valed \
checks (known instructions, forward jumps inside the program, a return at the end) and runs \
on each frame's captured bytes (the first --snaplen). Frames it does not accept are neither \
captured nor counted; a frame that finds the buffer full is counted as a capture drop before \
the filter sees it. Filters run on the workers every port shares, so each user's filters \
together run on a budget (about 15 million instructions a second, all of that user's \
captures and workers together): a frame met when it is spent is not filtered nor captured \
and is counted as a capture drop too, shown apart ('over valed's filter budget'). A short \
filter, a smaller --snaplen or a quieter port keep within it.",
        after_help = "EXAMPLES:\n  \
vale-ctl capture vale0:a -w a.pcapng -c 1000      both directions, until 1000 frames\n  \
vale-ctl capture vale0:a --dir rx -w - | tcpdump -nr -    live, what vale0:a receives\n  \
vale-ctl capture vale0:h1 --duration 10 --format pcap -w h1.pcap\n  \
vale-ctl capture vale0:vm1 --snaplen 128 -w - | tshark -r - -q -z io,stat,1\n  \
vale-ctl capture vale0:h1 -c 10 -w - icmp or arp | tcpdump -nr -"
    )]
    Capture(CaptureCmd),
    /// List switches and ports with their counters
    #[command(
        visible_alias = "ls",
        long_about = "Lists every switch, or only switch valeX, or only port valeX:Y. Each \
switch gets a header line\n\n  \
valeX  lookup MODULE  batch N  ports N\n\n\
and, under it, a table of its ports:\n\n  \
NAME       the port, valeX:Y\n  \
KIND       native: a libvale client\n  \
UID        the user the port belongs to: only it or an administrator may destroy,\n             \
detach or tune the port, or reopen it once free\n  \
PID        pid of the process holding the port (valed's own for a host port, of any kind\n             \
but native), - if none\n  \
PERSIST    yes: made by 'vale-ctl create', stays when no client holds it\n  \
RINGS      tx/rx rings (- while no client holds the port)\n  \
SLOTS      slots per ring\n  \
BUF        buffer size, bytes\n  \
MOD(us)    interrupt moderation toward the client, microseconds\n  \
LEARNT     source MACs the learning bridge holds for the port / its learn-limit\n  \
TX-PKTS    frames the client sent into the switch (TX-BYTES: their bytes)\n  \
RX-PKTS    frames the switch delivered to the client (RX-BYTES: their bytes)\n  \
RX-DROP    frames for the port dropped: its receive ring was full, nobody held it, or\n             \
its device refused them or was down\n  \
TX-DROP    frames from the port that had nowhere to go\n  \
BAD        frames refused because the client wrote bad ring values (a guest: bad\n             \
descriptors, chains or frames)\n  \
NOLEARN    source MACs of the port's frames not learnt: the port held its learn-limit, or\n             \
the table had no room but other ports' live entries (the frames are still\n             \
forwarded)\n\n\
Under a switch's table, a line per port whose device negotiated something: for a\n\
vhost-user port with a guest, the virtio features the guest acked and the offloads\n\
frames to it may carry (the rest the switch does in software); for a memif port with a\n\
client, the client's name and its rings.\n\n\
With no switches, prints nothing. With --json, prints a JSON array of switches (name, \
lookup, batch, ports), each port with the fields above (name, kind, device, mode, state, \
persistent, owner_pid, owner_uid, tx_rings, rx_rings, slots, buf_size, moderation_us, learn_limit, \
learnt, negotiated when there is something, counters); for one switch or one port it \
is still an array, of that one switch (with only that port). An unknown NAME is an error."
    )]
    List {
        /// Show only this switch (valeX) or port (valeX:Y)
        #[arg(value_name = "NAME", value_parser = any_name)]
        name: Option<String>,
    },
    /// Create a persistent port (and its switch, if absent)
    #[command(
        long_about = "Creates persistent port valeX:Y, and switch valeX if it does not \
exist. A persistent port stays, with its counters, when no client holds it; a client that \
opens it later gets it. Creating a port that exists makes it persistent."
    )]
    Create {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
    },
    /// Destroy a port or a whole switch
    #[command(
        visible_alias = "rm",
        long_about = "Destroys port valeX:Y, or switch valeX with all its ports. A port held \
by a client is taken from it: the client keeps its mapping, but valed no longer forwards \
to or from it."
    )]
    Destroy {
        /// The port (valeX:Y) or switch (valeX)
        #[arg(value_name = "NAME", value_parser = any_name)]
        name: String,
    },
    /// Attach a device of the host as a port
    #[command(
        long_about = "Attaches a device of the host as port valeX:Y (and makes switch valeX \
if absent). valed itself moves the device's frames to and from the switch; the port stays \
until 'vale-ctl detach' or 'vale-ctl destroy'. Attaching needs an administrator (root, \
valed's own user, or a member of valed --admin-group); the port then belongs to the caller."
    )]
    Attach(AttachCmd),
    /// Give a TAP or NIC port's device back
    #[command(
        long_about = "Stops port valeX:Y's traffic and gives its device back: a TAP device is \
closed (and goes away unless it was attached with --persist); a network interface returns \
to the kernel. The port goes too, unless it is persistent ('vale-ctl create')."
    )]
    Detach {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
    },
    /// Write the running configuration to valed's configuration file
    #[command(
        long_about = "Writes the running configuration to the file valed was started with \
(valed --config FILE), atomically (a new file renamed over the old one): every switch with \
its batch and lookup module (its arguments and, for flow, its rules), and its persistent and \
device ports (TAP, NIC, vhost-user, memif: their devices and arguments) with their knobs \
(moderation, learn-limit) and owners. Ports a client opened and holds are the client's and \
are not saved. valed applies the file when it starts again, and re-adopts TAP devices (a \
TAP attached with --persist and moved into a network namespace is found there again) and \
NICs, so traffic resumes with no action. A configuration larger than valed reads at start \
(16 MiB: about 108000 flow rules that match two MAC addresses, two IPv4 addresses and two \
ports) is not written, and \
the old file stays as it was. Needs an administrator. Prints the path and what \
was saved; with --json, {\"path\":...,\"switches\":N,\"ports\":N}."
    )]
    Save,
    /// Set a knob of a switch or a port
    #[command(
        long_about = "Sets a knob of switch valeX or of port valeX:Y. The change takes \
effect at once.\n\n\
Switch knobs:\n  \
batch N          frames gathered from a source ring per pass, 1-2048 (default 512)\n  \
lookup MODULE    how destinations are chosen, unconfigured ('vale-ctl lookup'\n                   \
configures one):\n                     \
learning   the learning bridge: learns source MACs, floods unknown,\n                                \
broadcast and multicast destinations (default)\n                     \
hub        floods every frame to every other port\n                     \
vlan       the 802.1Q bridge, every port an access port of VLAN 1\n                     \
flow       the flow table, empty: every frame goes to the bridge\n\n\
Port knobs:\n  \
moderation US    microseconds between interrupts toward the client,\n                   \
0-1000000; 0 = immediate (default). A vhost-user guest that\n                   \
negotiated event indices also kicks about this far apart\n                   \
(at most 200) while it streams: fewer wake-ups of valed, each\n                   \
frame about half the interval later\n  \
learn-limit N    most source MACs the learning bridge keeps for the port,\n                   \
0-1048576 (default 1024; 0: learn none). A port at its limit\n                   \
learns a new address only in place of one of its own; no port\n                   \
ever pushes out another port's live entries"
    )]
    Set {
        /// The switch (valeX) or port (valeX:Y)
        #[arg(value_name = "TARGET", value_parser = any_name)]
        target: String,
        /// batch or lookup (switch); moderation or learn-limit (port)
        #[arg(value_name = "KNOB")]
        knob: String,
        /// The new value
        #[arg(value_name = "VALUE", allow_negative_numbers = true)]
        value: String,
    },
    /// Show or choose a switch's lookup module
    #[command(
        long_about = "With SWITCH alone, shows switch valeX's lookup module: its name, where it \
comes from (built-in, or the shared object's path), the configuration it was made with and its \
own counters.\n\n\
With MODULE, makes it the switch's lookup module, configured by --arg KEY=VALUE (repeatable, \
in order) and, for vlan, --access, --trunk and --default. MODULE is a built-in module's name \
or the path of a shared object built against vale_lookup.h (a path holds a '/': \
./libmine.so). A module that cannot be loaded or configured leaves the switch's module as it \
was, and the error says why. The swap loses and duplicates no frame: each batch is forwarded \
by the old module or by the new. Choosing a module needs an administrator.\n\n\
Built-in modules and their arguments:\n  \
learning   the learning bridge (default). --arg entries=N (table size, 64-1048576, default\n             \
8192), --arg age=S (seconds an address lives unrefreshed, default 300)\n  \
hub        floods every frame to every other port; no arguments\n  \
vlan       an 802.1Q learning bridge, a learning table per VLAN, flooding kept inside\n             \
the VLAN. --access PORT=VID: an access port (untagged frames of VLAN VID; a\n             \
frame tagged with another VLAN is dropped and counted). --trunk PORT=VIDS: a\n             \
trunk port carrying frames tagged with the VLANs listed (10,20,30-39). Tags\n             \
are added and removed as frames leave. --default VID|none: the VLAN of ports\n             \
not named (default 1; none: they get and send nothing). PORT is valeX:Y or Y.\n             \
--arg entries=N (each VLAN's table, default 1024), --arg age=S\n  \
flow       an ordered match/action table (see 'vale-ctl flow --help'). --rules FILE:\n             \
its rules, one a line; vale-ctl reads the file and sends its text. --arg\n             \
default=normal|drop|flood|output:PORT: what a frame matching no rule gets\n             \
(default normal: the learning bridge). --arg entries=N, --arg age=S: the\n             \
learning table of 'normal', as learning's",
        after_help = "EXAMPLES:\n  \
vale-ctl lookup vale0\n  \
vale-ctl lookup vale0 vlan --access a=10 --access b=20 --trunk up=10,20\n  \
vale-ctl lookup vale0 flow --rules rules.txt --arg default=drop\n  \
vale-ctl lookup vale0 ./libmylookup.so --arg k=v\n  \
vale-ctl lookup vale0 learning        back to the default"
    )]
    Lookup(LookupCmd),
    /// Add, delete and show the rules of a switch's flow table
    #[command(
        long_about = "Changes or shows the rules of switch valeX, whose lookup module must be \
flow ('vale-ctl lookup valeX flow [--rules FILE]'). add, del and dump are the flow module's own \
commands: 'vale-ctl flow' sends the request 'vale-ctl module valeX add|del|dump BODY' sends, \
and shows the module's answer as a table.\n\n\
A rule is\n\n  \
[prio=N] [FIELD=VALUE|SHORTHAND],... actions=ACTION\n\n\
with fields and shorthands separated by commas or spaces, in any order:\n  \
prio=N             0-65535, higher wins (default 32768); equal priorities:\n                     \
the rule added first wins. Also priority=N\n  \
in_port=PORT       frames from port valeX:Y\n  \
dl_src=MAC[/MASK]  source MAC (xx:xx:xx:xx:xx:xx), masked if MASK given\n  \
dl_dst=MAC[/MASK]  destination MAC\n  \
dl_type=N          EtherType (after an 802.1Q tag), 0x0800 or 2048\n  \
dl_vlan=VID|none   the 802.1Q tag's VLAN (0-4095), or no tag\n  \
nw_src=A.B.C.D[/LEN], nw_dst=...   IPv4 addresses, prefixes (needs ip)\n  \
ipv6_src=ADDR[/LEN], ipv6_dst=...  IPv6 addresses, prefixes (needs ipv6)\n  \
nw_proto=N         IP protocol, 0-255 (needs ip or ipv6)\n  \
tp_src=N[/MASK], tp_dst=N[/MASK]   TCP/UDP ports (need tcp or udp)\n  \
ip, ipv6, arp      dl_type=0x0800, 0x86dd, 0x0806\n  \
icmp, tcp, udp     ip with nw_proto=1, 6, 17\n  \
icmp6, tcp6, udp6  ipv6 with nw_proto=58, 6, 17\n\n\
ACTION is one of: output:PORT (to port valeX:Y of this switch; a port not there now\n\
drops the frames and counts them as no_port), drop, flood (every other port),\n\
normal (the learning bridge decides). A frame matching no rule gets the table's\n\
default (normal unless set with --arg default=...).\n\n\
add RULE...        adds rules (each argument one rule, --rules FILE one a line): all or\n                     \
none; a bad rule is refused with its line and what is wrong, and the\n                     \
table stays as it was. Prints the rules added with their ids.\n\
del ID|MATCH       deletes rule ID (7 or id=7), or every rule whose match is exactly\n                     \
MATCH (with prio=N: and whose priority is N). Prints what went.\n\
dump               every rule in the order they are tried, with its id and hit counter.\n\n\
add and del need an administrator, as choosing the module does; dump is open to anyone\n\
who may connect. Changes take effect at once, under traffic: each batch of frames is\n\
decided by the table before the change or by the table after, never by both, and the\n\
hit counters of the rules that stay go on counting.",
        after_help = "EXAMPLES:\n  \
vale-ctl lookup vale0 flow --rules rules.txt\n  \
vale-ctl flow vale0 add 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop'\n  \
vale-ctl flow vale0 add 'in_port=vale0:a actions=output:vale0:b' 'actions=drop'\n  \
vale-ctl flow vale0 add --rules more.txt\n  \
vale-ctl flow vale0 del 7\n  \
vale-ctl flow vale0 del 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22'\n  \
vale-ctl flow vale0 dump --json"
    )]
    Flow {
        /// The switch, valeX
        #[arg(value_name = "SWITCH", value_parser = switch_name)]
        switch: String,
        #[command(subcommand)]
        op: FlowOp,
    },
    /// Send a command of the switch's lookup module, and print its answer
    #[command(
        long_about = "Sends command OP with text BODY to the lookup module of switch valeX, and \
prints the module's answer as it is (with --json: {\"module\", \"output\"}). valed and \
vale-ctl read neither: what commands there are, what their bodies say and what they answer \
is the module's (see its documentation). BODY - reads the body from standard input.\n\n\
The flow module's commands are add (rules, one a line: all or none), del (a rule id or a \
match) and dump (body after=N: the page of at most 1024 rules after position N; nothing for \
the first page; 'next' in the answer says the N of the page after), each answering the JSON of \
the rules added, deleted or dumped; 'vale-ctl flow' sends them and shows the answers as \
tables. A shared object (vale_lookup.h, version 3) answers the commands its control function \
knows. The built-in learning, hub and vlan modules take no commands.\n\n\
A command is an administrator's unless the module opens it to anyone (the flow module opens \
dump). A module without the command refuses it (unsupported), as a module without commands \
refuses every one.",
        after_help = "EXAMPLES:\n  \
vale-ctl module vale0 dump                    the flow module's first page of rules, as JSON\n  \
vale-ctl module vale0 dump after=1024         the page after\n  \
vale-ctl module vale0 add - < rules.txt       the body from standard input\n  \
vale-ctl module vale0 status                  a shared object's own command"
    )]
    Module {
        /// The switch, valeX
        #[arg(value_name = "SWITCH", value_parser = switch_name)]
        switch: String,
        /// The module's command
        #[arg(value_name = "OP")]
        op: String,
        /// Its body (text; - reads standard input; absent: empty)
        #[arg(value_name = "BODY|-")]
        body: Option<String>,
    },
    /// Live per-port rates (packets, bits, drops per second), refreshed like top
    #[command(
        long_about = "Shows every port's rates, refreshed every second (--interval), like top: \
the busiest ports first. It reads the counters 'vale-ctl list' shows, and the workers' \
counters, over the control socket, and shows what changed per second since the last refresh.\n\n\
The header gives the time, the number of ports, the totals of the columns below and each \
forwarding worker's busy share (CPU time of its thread, polling and forwarding, per second of \
wall time). Then a line per port:\n\n  \
PORT      the port, valeX:Y\n  \
KIND      native (a libvale client), or a host port's kind ('vale-ctl attach --help')\n  \
STATE     up; down (its device is down or gone); free (persistent, nobody holds it)\n  \
RX-PPS    frames per second the switch delivered to the port (RX-BPS: bits per second)\n  \
TX-PPS    frames per second the port sent into the switch (TX-BPS: bits per second)\n  \
DROPS/S   frames per second dropped: for the port (its ring full, nobody holding it, its\n            \
device refusing them) or from it (nowhere to go); RX-DROP plus TX-DROP of 'list'\n  \
BAD/S     frames per second refused because the client wrote bad ring values\n\n\
A port that appeared since the last refresh shows - until the next. Rates read as 1.23k, \
4.56M, 7.89G (powers of 1000).\n\n\
On a terminal, top takes the whole screen (as many ports as fit) until q or Ctrl-C. With \
--once or -n COUNT, or when stdout is not a terminal, it prints plain tables one after the \
other (the first after one interval: a rate needs two looks), all ports, and exits after COUNT \
of them (or at Ctrl-C, SIGTERM). With --json, each refresh is one line of JSON: \
{\"interval_s\", \"ports\": [{\"name\", \"kind\", \"state\", \"rx_pps\", \"rx_bps\", \
\"tx_pps\", \"tx_bps\", \"drops_per_s\", \"bad_input_per_s\"}], \"workers\": [{\"id\", \
\"busy_percent\"}]} (null where a port is new).\n\n\
Anyone who may connect to valed may watch every port: top changes nothing.",
        after_help = "EXAMPLES:\n  \
vale-ctl top                      every port, live, until q\n  \
vale-ctl top vale0                the ports of switch vale0\n  \
vale-ctl top vale0:a --once       one table of one port, after one second\n  \
vale-ctl top -n 10 -i 0.5 --json  ten JSON lines, half a second apart"
    )]
    Top(TopCmd),
}

// `vale-ctl capture`.
#[derive(Args, Debug)]
pub(crate) struct CaptureCmd {
    /// The port, valeX:Y
    #[arg(value_name = "PORT", value_parser = port_name)]
    pub(crate) port: String,
    /// Write to FILE (- or no -w: standard output)
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub(crate) file: Option<PathBuf>,
    /// Which frames: rx (the switch delivers to the port), tx (the port sends), both
    #[arg(long, value_enum, default_value = "both")]
    pub(crate) dir: capture::Dir,
    /// Stop after COUNT frames
    #[arg(short = 'c', long, value_name = "COUNT",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) count: Option<u64>,
    /// Stop after SECS seconds (0.1 to 3600)
    #[arg(long, value_name = "SECS", value_parser = interval)]
    pub(crate) duration: Option<std::time::Duration>,
    /// Bytes of each frame kept (1 to 65535); longer frames are cut, their length kept
    #[arg(short = 's', long, default_value = "2048", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub(crate) snaplen: u32,
    /// Size of valed's capture buffer, MiB (1 to 256)
    #[arg(short = 'B', long = "buffer", default_value = "16", value_name = "MIB",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) buffer: u32,
    /// Output format
    #[arg(long, value_enum, default_value = "pcapng")]
    pub(crate) format: capture::Format,
    /// Print nothing on standard error at the end
    #[arg(short = 'q', long)]
    pub(crate) quiet: bool,
    /// Capture only the frames this tcpdump expression accepts (pcap-filter(7))
    #[arg(value_name = "EXPRESSION", trailing_var_arg = true)]
    pub(crate) expression: Vec<String>,
}

// `vale-ctl attach`: PORT and the generic form are here; each kind's flag and
// options come from its registration entry ([`crate::ports::flags`] adds them).
#[derive(Args, Debug)]
pub(crate) struct AttachCmd {
    /// The port, valeX:Y
    #[arg(value_name = "PORT", value_parser = port_name)]
    pub(crate) port: String,
    /// The generic form: a port kind, then its arguments
    #[arg(value_name = "KIND", help = crate::ports::kind_help())]
    pub(crate) kind: Option<String>,
    /// The kind's arguments
    #[arg(value_name = "KEY=VALUE", requires = "kind", value_parser = key_value)]
    pub(crate) kind_args: Vec<(String, String)>,
    /// What valed is asked for, from the flags or the generic form ([`crate::ports::request`]).
    #[arg(skip)]
    pub(crate) request: crate::ports::Attach,
}

// `vale-ctl lookup`.
#[derive(Args, Debug)]
pub(crate) struct LookupCmd {
    /// The switch, valeX
    #[arg(value_name = "SWITCH", value_parser = switch_name)]
    pub(crate) switch: String,
    /// A built-in module's name, or a shared object's path
    #[arg(value_name = "MODULE")]
    pub(crate) module: Option<String>,
    /// A module argument (repeatable)
    #[arg(long = "arg", value_name = "KEY=VALUE", requires = "module", value_parser = key_value)]
    pub(crate) args: Vec<(String, String)>,
    /// vlan: an access port and its VLAN (repeatable)
    #[arg(long, value_name = "PORT=VID", requires = "module")]
    pub(crate) access: Vec<String>,
    /// vlan: a trunk port and its VLANs (repeatable)
    #[arg(long, value_name = "PORT=VIDS", requires = "module")]
    pub(crate) trunk: Vec<String>,
    /// vlan: the VLAN of ports not named, or none
    #[arg(long, value_name = "VID|none", requires = "module")]
    pub(crate) default: Option<String>,
    /// flow: a file of rules, one a line
    #[arg(long, value_name = "FILE", requires = "module")]
    pub(crate) rules: Option<PathBuf>,
}

// `vale-ctl top`.
#[derive(Args, Debug)]
pub(crate) struct TopCmd {
    /// Show only this switch (valeX) or port (valeX:Y)
    #[arg(value_name = "NAME", value_parser = any_name)]
    pub(crate) name: Option<String>,
    /// Seconds between refreshes (0.1 to 3600)
    #[arg(short = 'i', long, default_value = "1", value_name = "SECS",
          value_parser = interval)]
    pub(crate) interval: std::time::Duration,
    /// Show one table (after one interval) and exit: -n 1
    #[arg(long, conflicts_with = "count")]
    pub(crate) once: bool,
    /// Show COUNT tables and exit
    #[arg(short = 'n', long, value_name = "COUNT",
          value_parser = clap::value_parser!(u64).range(1..),
          default_value_if("once", "true", "1"))]
    pub(crate) count: Option<u64>,
}

/// vale-ctl's command line: the derived [`Cli`], with `attach`'s kind flags and options, which
/// come from the kinds' registration entries ([`crate::ports::flags`]). `--help`, the man
/// pages and parsing all use this one.
pub(crate) fn command() -> clap::Command {
    Cli::command().mut_subcommand("attach", crate::ports::flags)
}

/// The command line of this process; a usage error ends it (status 2), as clap's do.
pub(crate) fn parse() -> Cli {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// The command line `args` (the program's name first).
pub(crate) fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
    if let (Command::Attach(c), Some(m)) = (&mut cli.command, matches.subcommand_matches("attach"))
    {
        c.request = crate::ports::request(c, m).map_err(|(kind, message)| {
            let attach = cmd
                .find_subcommand_mut("attach")
                .expect("attach is a command");
            attach.error(kind, message)
        })?;
    }
    Ok(cli)
}

/// Seconds between refreshes of `top`.
pub(crate) fn interval(s: &str) -> Result<std::time::Duration, ValueError> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(ValueError::Seconds(s.to_string())),
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum FlowOp {
    /// Add rules (all or none)
    Add {
        /// Rules, one an argument
        #[arg(value_name = "RULE", required_unless_present = "rules")]
        rule: Vec<String>,
        /// A file of rules, one a line (blank lines and lines starting with # skipped)
        #[arg(long, value_name = "FILE")]
        rules: Option<PathBuf>,
    },
    /// Delete rules: one by id, or all with exactly a match
    Del {
        /// A rule id (7, id=7) or a match ([prio=N] FIELD=VALUE,...)
        #[arg(value_name = "ID|MATCH")]
        selector: String,
    },
    /// Every rule with its hit counter (asked for 1024 rules at a time)
    Dump,
}

/// A switch (`valeX`).
pub(crate) fn switch_name(s: &str) -> Result<String, ValueError> {
    parse_switch(s).map_err(ValueError::name)?;
    Ok(s.to_string())
}

/// `KEY=VALUE`.
pub(crate) fn key_value(s: &str) -> Result<(String, String), ValueError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(ValueError::KeyValue(s.to_string())),
    }
}

/// The `vlan` module's arguments from `--access`, `--trunk` and `--default`: ports as full
/// names (`Y` is taken as `SWITCH:Y`).
pub(crate) fn vlan_args(
    switch: &str,
    access: &[String],
    trunk: &[String],
    default: Option<&str>,
) -> Result<Vec<ModuleArg>, ValueError> {
    let mut out = Vec::new();
    for (key, list) in [("access", access), ("trunk", trunk)] {
        for a in list {
            let (port, vids) = a.split_once('=').ok_or_else(|| ValueError::VlanPort {
                flag: key,
                value: a.clone(),
            })?;
            let port = if port.contains(':') {
                port.to_string()
            } else {
                format!("{switch}:{port}")
            };
            let (sw, _) = parse_port(&port).map_err(ValueError::name)?;
            if sw != switch {
                return Err(ValueError::OtherSwitch {
                    flag: key,
                    value: a.clone(),
                    port,
                    switch: switch.to_string(),
                });
            }
            out.push(ModuleArg {
                key: key.to_string(),
                value: format!("{port}={vids}"),
            });
        }
    }
    if let Some(d) = default {
        out.push(ModuleArg {
            key: "default".into(),
            value: d.to_string(),
        });
    }
    Ok(out)
}

/// A switch (`valeX`) or a port (`valeX:Y`).
pub(crate) fn any_name(s: &str) -> Result<String, ValueError> {
    if s.contains(':') {
        parse_port(s).map_err(ValueError::name)?;
    } else {
        parse_switch(s).map_err(ValueError::name)?;
    }
    Ok(s.to_string())
}

/// A port (`valeX:Y`).
pub(crate) fn port_name(s: &str) -> Result<String, ValueError> {
    parse_port(s).map_err(ValueError::name)?;
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command with the kinds' flags and options: no clash with vale-ctl's own.
    #[test]
    fn cli_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn names_are_checked() {
        assert!(Cli::try_parse_from(["vale-ctl", "create", "vale0"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "create", "vale0:a b"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "rm", "foo"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "ls", "vale0:a", "--json"]).is_ok());
        assert!(Cli::try_parse_from(["vale-ctl", "set", "vale0", "batch", "64"]).is_ok());
    }

    /// `top --once` is `top -n 1` (clap fills in the count), and not both.
    #[test]
    fn once_is_one_table() {
        let count = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Top(t)) => Ok(t.count),
            Ok(_) => panic!("not top"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(count(&["vale-ctl", "top", "--once"]), Ok(Some(1)));
        assert_eq!(count(&["vale-ctl", "top", "-n", "3"]), Ok(Some(3)));
        assert_eq!(count(&["vale-ctl", "top"]), Ok(None));
        assert_eq!(
            count(&["vale-ctl", "top", "--once", "-n", "3"]),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
        assert_eq!(
            count(&["vale-ctl", "top", "-n", "1", "--once"]),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
    }
}
