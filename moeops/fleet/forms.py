"""The form that takes `nvidia-smi topo` text, shared by the host page and the admin: both hand
it to fleet.services.topology_import, which parses it as the API does."""

from django import forms

from domain.topology import P2P_KINDS

# The longest text taken, as the API's nvidia_smi_topo.
MAX_TOPO_CHARS = 1_000_000
P2P_CHOICES = tuple((kind, f"-p2p {kind[0]} ({kind})") for kind in P2P_KINDS)


class TopologyTextForm(forms.Form):
    """`nvidia-smi topo -m` text, and optionally one `topo -p2p r|w|n|a` text."""

    matrix_text = forms.CharField(
        label="nvidia-smi topo -m",
        max_length=MAX_TOPO_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text="The whole output, legends included.",
    )
    p2p_kind = forms.ChoiceField(label="P2P matrix", choices=P2P_CHOICES, initial="read")
    p2p_text = forms.CharField(
        label="nvidia-smi topo -p2p (optional)",
        max_length=MAX_TOPO_CHARS,
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
    )

    def import_fields(self):
        """The texts as fleet.services.topology_import takes them."""
        data = self.cleaned_data
        p2p = {data["p2p_kind"]: data["p2p_text"]} if data["p2p_text"].strip() else {}
        return {"matrix_text": data["matrix_text"], "p2p_texts": p2p}

    def add_parse_error(self, error):
        """A domain.topology.TopologyParseError as a sentence on the field whose text it is."""
        field = "p2p_text" if error.source.startswith("p2p ") else "matrix_text"
        self.add_error(field, str(error))
